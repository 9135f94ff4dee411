"""The ``sd-edit:PATH,option=value,...`` editor spec's options -> an :class:`SDEditor`.

Lists inside an option (the sweep) are separated by ``/``, since ``,`` separates options:
``sd-edit:stable-diffusion-v1-5/stable-diffusion-v1-5,steps=50,self=0.4/0.6/0.8,clip=open_clip:ViT-L-14:openai``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Literal

from pydantic import ValidationError

from sleuth.tools.backends.base import BackendError, EditCost
from sleuth.tools.backends.sd_edit.cache import InversionCache
from sleuth.tools.backends.sd_edit.controls import QualityThresholds, Scorer
from sleuth.tools.backends.sd_edit.editor import EditSettings, SDEditor, default_cost
from sleuth.tools.backends.sd_edit.inversion import InversionSettings

INVERSION = {"steps": "steps", "guidance": "guidance", "null_steps": "null_steps", "null_lr": "null_lr",
             "null_tol": "null_tol"}
EDITING = {"cross": "cross_steps", "self": "self_steps", "mode": "mode", "weight": "edit_word_weight",
           "blend": "local_blend", "blend_threshold": "blend_threshold", "blend_start": "blend_start",
           "self_max_tokens": "self_max_tokens", "rows": "max_rows", "keep": "keep"}
THRESHOLDS = {"image_image": "image_image", "image_text": "image_text", "directional": "directional",
              "class_word": "class_word"}
OTHER = {"device", "dtype", "size", "cache", "cache_items", "clip", "inversion_cost", "edit_cost", "pairs", "start"}
OPTIONS = set(INVERSION) | set(EDITING) | set(THRESHOLDS) | OTHER
"""Every option the spec accepts (``clip`` is a CLIP spec, e.g. ``open_clip:ViT-B-32:/path``)."""


def _pick(options: dict[str, str], names: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, field in names.items():
        if key in options:
            value = options[key]
            out[field] = [v for v in value.split("/") if v] if key in ("cross", "self") else value
    return out


def _int(options: dict[str, str], key: str) -> int | None:
    if key not in options:
        return None
    try:
        return int(options[key])
    except ValueError:
        raise BackendError(f"sd-edit option {key}={options[key]!r} is not an integer.") from None


def _float(options: dict[str, str], key: str) -> float | None:
    if key not in options:
        return None
    try:
        value = float(options[key])
    except ValueError:
        raise BackendError(f"sd-edit option {key}={options[key]!r} is not a number.") from None
    if not value >= 0:
        raise BackendError(f"sd-edit option {key} must be at least 0.")
    return value


def _cost(options: dict[str, str], default: EditCost) -> EditCost:
    """The declared cost, with the spec's overrides: ``inversion_cost``/``edit_cost`` in images of the
    generator (e.g. with a one-step generator an inversion costs hundreds of its images), ``pairs`` the cap."""
    pairs = _int(options, "pairs")
    if pairs is not None and pairs < 1:
        raise BackendError("sd-edit option pairs must be at least 1.")
    inv, edit = _float(options, "inversion_cost"), _float(options, "edit_cost")
    return replace(default, inversion=default.inversion if inv is None else inv,
                   edit=default.edit if edit is None else edit, max_pairs=pairs or default.max_pairs)


def _start(options: dict[str, str]) -> Literal["seed", "invert"]:
    """``start=seed`` (default): images the editor's weights drew from a seed are edited from its noise;
    ``start=invert``: every image is inverted."""
    value = options.get("start", "seed")
    if value == "seed":
        return "seed"
    if value == "invert":
        return "invert"
    raise BackendError(f"sd-edit option start={value!r}: use seed or invert.")


def editor_from_options(model: str, options: dict[str, str], *, device: str = "cpu", dtype: str | None = None,
                        class_names: Sequence[str] = (),
                        make_scorer: Callable[[str], Scorer] | None = None,
                        generator_passes: float | None = None) -> SDEditor:
    """An editor for ``model`` (pipeline folder or cached Hub id) from spec options (strings).

    ``device`` and ``dtype`` apply unless the options name their own. ``make_scorer`` turns the ``clip``
    option's value into a CLIP model. ``generator_passes``: UNet passes per image of the investigation's
    generator, the unit edits are charged in (``default_cost``); None: the editor's own images.
    """
    unknown = sorted(set(options) - OPTIONS)
    if unknown:
        raise BackendError(f"sd-edit: unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(OPTIONS))}.")
    try:
        inversion = InversionSettings(**_pick(options, INVERSION))
        editing = EditSettings(**_pick(options, EDITING))
        thresholds = QualityThresholds(**_pick(options, THRESHOLDS))
    except ValidationError as e:
        err = e.errors()[0]
        raise BackendError(f"sd-edit option {'.'.join(str(p) for p in err['loc'])}: {err['msg']}.") from None
    scorer = None
    if "clip" in options:
        if make_scorer is None:
            raise BackendError("sd-edit: the clip option needs a CLIP loader.")
        scorer = make_scorer(options["clip"])
    items = _int(options, "cache_items")
    if items is not None and items < 1:
        raise BackendError("sd-edit option cache_items must be at least 1.")
    cache = InversionCache(max_items=16 if items is None else items, directory=options.get("cache"))
    cost = _cost(options, default_cost(inversion, editing, scorer is not None, generator_passes))
    return SDEditor(model, device=options.get("device", device), dtype=options.get("dtype", dtype),
                    inversion=inversion, editing=editing, thresholds=thresholds, scorer=scorer,
                    class_names=class_names, size=_int(options, "size"), cache=cache, cost=cost,
                    start=_start(options))
