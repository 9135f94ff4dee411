"""Models packaged with sleuth by name: ``toyworld-sd`` and ``toyworld-clip`` (see ``toyworld.diffusion``).

A packaged name resolves to its folder in the package wherever a path or Hub id is accepted (``diffusers:``,
``sd-edit:``, ``clip:``). Kept apart from the toyworld package, so resolving a real model's path never loads toyworld.
"""

from __future__ import annotations

from pathlib import Path

from sleuth.tools.backends.base import BackendError

WEIGHTS = Path(__file__).resolve().parent / "toyworld" / "weights"
PACKAGED = {"toyworld-clip": "config.json", "toyworld-sd": "model_index.json"}
"""Packaged model names, and the file that shows the folder is complete."""
GENERATOR_DEFAULTS: dict[str, dict[str, float]] = {"toyworld-sd": {"steps": 25, "guidance": 7.5, "batch": 64}}
"""Generator settings a packaged model is measured with, used unless the spec sets them (``diffusers:toyworld-sd,
steps=50``): a 64 px model runs whole batches where Stable Diffusion's defaults assume 512 px."""
EDITOR_DEFAULTS: dict[str, dict[str, str]] = {"toyworld-sd": {"keep": "class", "steps": "25"}}
"""Editor options a packaged model is used with unless the spec sets them (``sd-edit:toyworld-sd,keep=none``):
toyworld-sd's cross-attention is nearly uniform (its text also enters through a pooled embedding), so the changed
words' maps cannot confine an edit and the class region is kept instead (``sd_edit.regions``). It draws its images
in 25 steps, and its null-text reconstructions are as good at 25 steps as at 50 (docs/toyworld_sd.md), so edits
run at 25, at half the cost."""


def packaged(ref: str) -> Path | None:
    """The folder of a packaged model name; None for anything else (a path or a Hub id)."""
    if ref not in PACKAGED:
        return None
    folder = WEIGHTS / ref
    if not (folder / PACKAGED[ref]).is_file():
        raise BackendError(f"{ref}: this installation has no trained {ref} in {folder}. Train it from a source "
                           f"checkout with `python scripts/train_toyworld_sd.py` (about an hour on two CPU cores; "
                           f"--out names another folder, then pass that folder instead of {ref}).")
    return folder
