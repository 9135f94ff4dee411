"""Command-line flags that choose the planner, shared by every command that runs an investigation.

The protocol planner is the default. ``--llm MODEL`` selects the LLM planner with any litellm model string; the
API key is read from the provider's usual environment variable (or the one ``--api-key-env`` names), never from
the command line, where it would land in shell history and process listings.
"""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING, Any

from sleuth.agent.cli import UsageError
from sleuth.agent.loop import Planner
from sleuth.tools.backends.base import Backends

if TYPE_CHECKING:
    from sleuth.agent.llm.client import LLMConfig

PLANNERS = ("protocol", "llm")


def add_planner_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--planner", choices=PLANNERS, default=None,
                   help="Planner: protocol (the offline, deterministic procedure; the default) or llm (the default "
                        "when --llm is given).")
    g = p.add_argument_group("LLM planner")
    g.add_argument("--llm", metavar="MODEL",
                   help="Plan with this litellm model, e.g. gpt-4o-mini, anthropic/claude-sonnet-4-5, "
                        "ollama_chat/qwen2.5, or openai/NAME with --api-base for an OpenAI-compatible server.")
    g.add_argument("--api-base", metavar="URL",
                   help="Base URL of an OpenAI-compatible server (llama.cpp, vLLM, Ollama), e.g. "
                        "http://127.0.0.1:8080/v1.")
    g.add_argument("--api-key-env", metavar="VAR",
                   help="Environment variable that holds the API key (default: the provider's own, e.g. "
                        "OPENAI_API_KEY). Keys are never written to transcripts or logs.")
    g.add_argument("--planner-sees-images", action="store_true",
                   help="Show a vision-capable model thumbnails of the images in the latest results.")
    g.add_argument("--llm-timeout", type=float, default=120.0, metavar="S",
                   help="Seconds before one LLM request times out (default 120).")
    g.add_argument("--llm-retries", type=int, default=4, metavar="N",
                   help="Retries of a rate-limited, timed-out or failed LLM request, with backoff (default 4).")
    g.add_argument("--llm-context", type=int, default=24_000, metavar="TOKENS",
                   help="Rough token budget of each LLM request; older results are summarised to fit "
                        "(default 24000).")


def check_planner_args(args: argparse.Namespace) -> None:
    """Reject bad planner flags before any model is loaded; settles ``args.planner``."""
    if args.planner is None:
        args.planner = "llm" if args.llm else "protocol"
    if args.planner == "llm" and not args.llm:
        raise UsageError("--planner llm needs --llm MODEL (a litellm model string)")
    if args.planner == "protocol" and args.llm:
        raise UsageError("--llm is for the llm planner; drop --planner protocol or --llm")
    if not args.llm:
        for flag, value in (("--api-base", args.api_base), ("--api-key-env", args.api_key_env),
                            ("--planner-sees-images", args.planner_sees_images)):
            if value:
                raise UsageError(f"{flag} needs --llm MODEL")
        return
    if args.api_base and not args.api_base.startswith(("http://", "https://")):
        raise UsageError(f"--api-base must be an http:// or https:// URL, got {args.api_base!r}")
    if args.api_key_env and not os.environ.get(args.api_key_env):
        raise UsageError(f"--api-key-env: environment variable {args.api_key_env} is not set")
    if not args.llm_timeout > 0:
        raise UsageError(f"--llm-timeout must be positive, got {args.llm_timeout}")
    if not 0 <= args.llm_retries <= 20:
        raise UsageError(f"--llm-retries must be between 0 and 20, got {args.llm_retries}")
    if not 2000 <= args.llm_context <= 2_000_000:
        raise UsageError(f"--llm-context must be between 2000 and 2000000 tokens, got {args.llm_context}")


def llm_config(args: argparse.Namespace) -> LLMConfig | None:
    """The LLM the flags name, or None when no ``--llm`` was given."""
    from sleuth.agent.llm.client import LLMConfig

    if not getattr(args, "llm", None):
        return None
    return LLMConfig(model=args.llm, api_base=args.api_base, api_key_env=args.api_key_env,
                     timeout_s=args.llm_timeout, retries=args.llm_retries)


def build_llm_planner(args: argparse.Namespace, backends: Backends, label: str, *, session: Any = None,
                      mode: str = "investigate", client: Any = None) -> Any:
    """An ``LLMPlanner`` from the flags; with ``session`` (an ``agent.session.Session``) it is attached to it
    (see ``attach_session``)."""
    from sleuth.agent.llm import LLMClient
    from sleuth.agent.llm.context import ContextConfig
    from sleuth.agent.planners.llm import LLMPlanner
    from sleuth.agent.session import registry

    config = llm_config(args)
    if config is None:
        raise UsageError("no --llm MODEL given")
    client = client or LLMClient(config)
    planner = LLMPlanner(
        client, registry(), label=label, class_prompt=backends.prompt_for(label),
        labels=backends.classifier.labels.labels, budget=getattr(args, "budget", None),
        alpha=getattr(args, "alpha", 0.05), mode=mode,  # type: ignore[arg-type]
        context=ContextConfig(max_tokens=args.llm_context, sees_images=args.planner_sees_images),
    )
    if session is not None:
        attach_session(planner, session)
    return planner


def attach_session(planner: Planner, session: Any) -> None:
    """Connect an LLM planner to the session it plans for (a no-op for other planners): it reads thumbnails from
    the session's artifact store, and the session's tools get the same LLM as ``ctx.llm``."""
    from sleuth.agent.llm import tool_llm
    from sleuth.agent.planners.llm import LLMPlanner

    if isinstance(planner, LLMPlanner):
        planner.artifacts = session.artifacts
        session.ctx.llm = tool_llm(planner.client)  # type: ignore[attr-defined]


def build_planner(args: argparse.Namespace, backends: Backends, label: str, *, session: Any = None) -> Planner:
    """The planner the flags choose. Pass ``session`` so an LLM planner can use the run's artifacts and tools."""
    if getattr(args, "llm", None):
        return build_llm_planner(args, backends, label, session=session)
    from sleuth.agent.planners.protocol import ProtocolPlanner

    return ProtocolPlanner(label, backends.prompt_for(label), baseline_n=args.baseline_n)
