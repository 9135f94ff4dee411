"""sleuth tools: the investigation's tools and the backends they run on."""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sleuth.tools.registry import Registry


@cache
def investigation_tools() -> Registry:
    """The investigation's tools, in the order a planner is shown them (one registry per process: it is immutable)."""
    from sleuth.tools import (
        caption_failures,
        edit_image,
        finish,
        generate_and_classify,
        measure_rate,
        perturb_caption,
        record_finding,
    )
    from sleuth.tools.registry import Registry, tool_from_module

    modules = (generate_and_classify, caption_failures, perturb_caption, edit_image, measure_rate, record_finding,
               finish)
    return Registry([tool_from_module(m) for m in modules])
