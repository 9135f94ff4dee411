"""Which modules of agent/ and tools/ the selected tests exercise (``pytest --module-use``).

A module counts as exercised when a test runs at least one of its functions (module and class bodies, which run on
import, do not count; neither do lambdas and comprehensions), or, for a module that defines no function at all (only
constants and types), when it is imported. Only the processes that run tests are traced (each pytest-xdist worker,
merged at the end), and only while tests run (not while they are collected): code that runs only in a command a
test starts as a subprocess does not count.

With ``--module-use`` the run fails when a module is not exercised, and the summary names it; ``make test`` runs the
fast tier this way, so no module loses every fast test.
"""

from __future__ import annotations

import ast
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("agent", "tools")
_OPTIMIZED = 0x0001  # inspect.CO_OPTIMIZED: set on functions, not on module or class bodies


def project_modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module under agent/ and tools/, by dotted name (``sleuth.agent.config``)."""
    out = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(("sleuth", *parts))] = path.resolve()
    return out


def defines_functions(path: Path) -> bool:
    """Whether the module has a function or method of its own (else importing it is all a test can do with it)."""
    tree = ast.parse(path.read_text(), str(path))
    return any(isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) for node in ast.walk(tree))


def unexercised(modules: dict[str, Path], ran: set[str], imported: set[str]) -> list[str]:
    """The modules none of whose functions ran (``ran``: files), or, without functions, that were never imported."""
    return [name for name, path in modules.items()
            if str(path) not in ran and (defines_functions(path) or name not in imported)]


class ModuleUse:
    """Records the files of the functions that run while tests run (a global trace hook that never traces lines)."""

    def __init__(self, modules: dict[str, Path]) -> None:
        self.modules = modules
        self.files = {str(p) for p in modules.values()}
        self.to_run = {str(p) for p in modules.values() if defines_functions(p)}
        self._module_file: dict[str, str] = {}
        """A code file's module file, or "" (module files are resolved, a code file's path may pass through a link)."""
        self.ran: set[str] = set()
        self.imported: set[str] = set()
        self.missing: list[str] = []
        self.whole = False

    def _trace(self, frame: FrameType, event: str, arg: Any) -> None:
        code = frame.f_code
        if code.co_flags & _OPTIMIZED and not code.co_name.startswith("<"):
            name = code.co_filename
            path = self._module_file.get(name)
            if path is None:
                real = os.path.realpath(name)
                path = self._module_file[name] = real if real in self.files else ""
            if path:
                self.ran.add(path)
        return None

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Iterator[None]:
        if self.to_run <= self.ran:  # every module has run: the rest of the run goes untraced, at full speed
            yield
            self.imported.update(n for n in self.modules if n in sys.modules)
            return
        sys.settrace(self._trace)
        threading.settrace(self._trace)
        try:
            yield
        finally:
            sys.settrace(None)
            threading.settrace(None)  # type: ignore[arg-type]  # typeshed omits None, which clears the hook
            self.imported.update(n for n in self.modules if n in sys.modules)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        config = session.config
        shared: dict[str, Any] | None = getattr(config, "workeroutput", None)
        if shared is not None:  # a pytest-xdist worker: the controller judges what all its workers ran
            shared["module_use"] = {"ran": sorted(self.ran), "imported": sorted(self.imported)}
            return
        self.whole = config.args_source == pytest.Config.ArgsSource.TESTPATHS and not config.option.keyword
        self.missing = unexercised(self.modules, self.ran, self.imported)
        if self.missing and self.whole and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: object) -> None:
        """A pytest-xdist worker is done: what it ran counts as run (the hook exists only under xdist)."""
        got = getattr(node, "workeroutput", {}).get("module_use")
        if got:
            self.ran.update(got["ran"])
            self.imported.update(got["imported"])

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.missing:
            terminalreporter.line(f"module use: all {len(self.modules)} modules of agent/ and tools/ exercised")
            return
        note = "" if self.whole else " (a run of some tests only: not a failure)"
        terminalreporter.section(f"modules no selected test exercises{note}")
        for name in self.missing:
            terminalreporter.line(name)
