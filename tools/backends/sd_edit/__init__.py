"""Counterfactual editing of real images with Stable Diffusion: DDIM inversion + null-text optimisation,
prompt-to-prompt through attention processors, LANCE's CLIP quality controls, and an inversion cache.

See docs/editing.md. ``SDEditor`` is the ``Editor`` that ``tools/edit_image`` uses on real models.
"""

from sleuth.tools.backends.sd_edit.cache import InversionCache, inversion_key
from sleuth.tools.backends.sd_edit.controls import EditScores, QualityThresholds, Scorer
from sleuth.tools.backends.sd_edit.editor import EditRun, EditSettings, SDEditor, edit_latents
from sleuth.tools.backends.sd_edit.inversion import Inversion, InversionSettings, invert, reconstruct
from sleuth.tools.backends.sd_edit.p2p import Injection, TokenAlignment, align

__all__ = [
    "EditRun",
    "EditScores",
    "EditSettings",
    "Injection",
    "Inversion",
    "InversionCache",
    "InversionSettings",
    "QualityThresholds",
    "SDEditor",
    "Scorer",
    "TokenAlignment",
    "align",
    "edit_latents",
    "invert",
    "inversion_key",
    "reconstruct",
]
