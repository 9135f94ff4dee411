"""The modules of agent/ and tools/ import one another without a cycle.

An import counts when it runs with its module: at the top, under ``if`` (``TYPE_CHECKING`` included: a type that
needs the other module is a dependency all the same) or ``try``. Imports inside functions are deliberate late loads and
do not count, nor does a submodule's implicit import of its own package.
"""

from __future__ import annotations

import ast
from pathlib import Path

from module_use import project_modules

MODULES = project_modules()


def module_imports(name: str, path: Path, modules: dict[str, Path] = MODULES) -> set[str]:
    """The project modules ``name`` (at ``path``) imports when it is imported."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join([*parts, base] if base else parts)
                submodules = {f"{base}.{alias.name}" for alias in node.names} & modules.keys()
                # `from pkg import submodule` loads the submodule; `from pkg import name` loads pkg itself.
                targets.update(submodules if len(submodules) == len(node.names) else {base, *submodules})
            elif isinstance(node, ast.If | ast.Try):
                visit(node.body)
                visit(node.orelse)
                if isinstance(node, ast.Try):
                    for handler in node.handlers:
                        visit(handler.body)
                    visit(node.finalbody)

    visit(ast.parse(path.read_text(), str(path)).body)
    out = set()
    for target in targets:
        while target and target not in modules:  # `from pkg.mod import name` where pkg.mod.name is no module
            target = target.rpartition(".")[0]
        if target and target != name:
            out.add(target)
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of ``graph``: one path ``a -> ... -> a`` per strongly connected group of modules."""
    found: list[list[str]] = []
    done: set[str] = set()
    for start in sorted(graph):
        if start in done:
            continue
        stack: list[tuple[str, list[str]]] = [(start, [start])]
        seen = {start}
        while stack:
            node, path = stack.pop()
            for nxt in sorted(graph[node]):
                if nxt == start:
                    found.append([*path, start])
                    done.update(path)
                    stack.clear()
                    break
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, [*path, nxt]))
        done.add(start)
    return found


def test_no_module_of_agent_or_tools_takes_part_in_an_import_cycle() -> None:
    graph = {name: module_imports(name, path) for name, path in MODULES.items()}
    assert sum(map(len, graph.values())) > len(graph)  # the walk sees the imports it is meant to see
    assert cycles(graph) == []


def test_the_walk_finds_a_cycle_made_by_a_type_checking_import(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    files = {
        "pkg/__init__.py": "from pkg import a, b\n",
        "pkg/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import B\n",
        "pkg/b.py": "from pkg.a import A\ndef late():\n    from pkg.c import C\n",
        "pkg/c.py": "from pkg import b\n",
    }
    modules = {f"x.{Path(f).with_suffix('').as_posix().replace('/', '.').removesuffix('.__init__')}": tmp_path / f
               for f in files}
    for f, text in files.items():
        (tmp_path / f).write_text(text.replace("pkg", "x.pkg"))
    graph = {name: module_imports(name, path, modules) for name, path in modules.items()}
    assert graph == {"x.pkg": {"x.pkg.a", "x.pkg.b"}, "x.pkg.a": {"x.pkg.b"}, "x.pkg.b": {"x.pkg.a"},
                     "x.pkg.c": {"x.pkg.b"}}
    assert cycles(graph) == [["x.pkg.a", "x.pkg.b", "x.pkg.a"]]
