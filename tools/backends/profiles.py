"""Default settings of a diffusers generator and of the editor next to it, from what the weights are.

- **Distilled models** are drawn at the settings they were distilled for: SD-Turbo and SDXL-Turbo in one step
  without guidance, LCM pipelines in four steps at their guidance embedding's 8. They are known by their Hub ids
  (also as cached snapshots or folders of that name) and by an LCM pipeline class in ``model_index.json``.
- **The editing profile.** When the editor (``sd-edit``) runs on the generator's own weights, both draw the same
  way: a DDIM scheduler, the same steps, guidance and dtype. Then every image the generator draws is redrawn
  exactly by the editor from its seed, and a counterfactual edits it from that seed's noise with no inversion
  (``sd_edit.editor.seeded_start``). A setting given to one of them is taken by the other unless it sets its own;
  with none given they take the editor's defaults (50 steps, guidance 7.5; a packaged model's own, e.g.
  toyworld-sd's 25).

Spec options always win: ``diffusers:ID,steps=30`` draws 30 steps whatever the profile says, and the editor
follows it unless its own spec sets ``steps``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DISTILLED: dict[str, dict[str, float]] = {
    "sd-turbo": {"steps": 1, "guidance": 0.0},
    "sdxl-turbo": {"steps": 1, "guidance": 0.0},
    "stable-diffusion-3.5-large-turbo": {"steps": 4, "guidance": 0.0},
    "lcm_dreamshaper_v7": {"steps": 4, "guidance": 8.0, "rows": 1},
}
"""Repository names (lower case, without the organisation) -> steps and guidance they were distilled for; ``rows``:
UNet rows per step when guidance enters as an embedding (LCM), not as a second, unconditional row."""

LCM_PIPELINES = ("LatentConsistencyModelPipeline",)


def model_name(argument: str, folder: Path | None) -> str:
    """The repository name a spec's weights come from: the Hub id's, a cached snapshot's (``models--ORG--NAME``),
    or the folder's own."""
    if folder is not None:
        for part in reversed(folder.parts):
            if part.startswith("models--"):
                return part.split("--")[-1].lower()
    return argument.rstrip("/").split("/")[-1].lower()


def _pipeline_class(folder: Path | None) -> str:
    if folder is None:
        return ""
    try:
        return str(json.loads((folder / "model_index.json").read_text()).get("_class_name", ""))
    except (OSError, ValueError, AttributeError):
        return ""


def distilled(argument: str, folder: Path | None) -> dict[str, float] | None:
    """The settings a distilled model was made for; None for any other model."""
    known = DISTILLED.get(model_name(argument, folder))
    if known is not None:
        return dict(known)
    if _pipeline_class(folder) in LCM_PIPELINES:
        return {"steps": 4, "guidance": 8.0, "rows": 1}
    return None


@dataclass(frozen=True)
class Profile:
    """How a generator and an editor on the same weights both draw."""

    scheduler: str
    steps: int
    guidance: float


def same_weights(generator: Any, editor: Any) -> bool:
    """Whether two specs name the same weights (the same argument, or folders that resolve to the same place)."""
    if generator.kind != "diffusers" or editor.kind != "sd-edit" or not generator.argument:
        return False
    if generator.argument == editor.argument:
        return True
    from sleuth.tools.backends.base import BackendError
    from sleuth.tools.backends.loading import resolve_pretrained

    try:
        a = resolve_pretrained(generator.argument, what="diffusers pipeline")
        b = resolve_pretrained(editor.argument, what="Stable Diffusion pipeline")
    except BackendError:  # a missing model is reported when it is built, with its own message
        return False
    return a.resolve() == b.resolve()


def editing_profile(generator: Any, editor: Any, generator_defaults: dict[str, Any],
                    editor_defaults: dict[str, Any]) -> Profile | None:
    """The shared profile of a generator spec and an editor spec on the same weights; None when they are not on
    the same weights, or the generator is a distilled model or draws without guidance (its images are not what a
    guided prompt-to-prompt edit redraws: they are inverted instead)."""
    if not same_weights(generator, editor) or generator_defaults.get("distilled"):
        return None

    def pick(key: str, default: float) -> float:
        for options in (generator.options, editor.options, editor_defaults, generator_defaults):
            if key in options:
                return float(options[key])
        return default

    guidance = pick("guidance", 7.5)
    if guidance <= 1:
        return None  # a generator without guidance draws what no guided edit redraws: its images are inverted
    return Profile(scheduler="ddim", steps=int(pick("steps", 50)), guidance=guidance)
