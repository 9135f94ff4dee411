"""``--module-use``: a module counts when one of its functions runs (or, without functions, when it is imported)."""

from __future__ import annotations

import sys
from pathlib import Path

from module_use import ModuleUse, project_modules, unexercised


def test_modules_are_named_as_sleuth_imports_them() -> None:
    modules = project_modules()
    assert modules["sleuth.agent.config"].name == "config.py"
    assert modules["sleuth.tools.stats"].name == "__init__.py"
    assert all(name.startswith(("sleuth.agent", "sleuth.tools")) for name in modules)


def test_a_module_counts_when_a_function_of_it_runs_not_when_its_class_bodies_do(tmp_path: Path) -> None:
    (tmp_path / "mu_used.py").write_text("def f():\n    return 1\n")
    (tmp_path / "mu_classes.py").write_text("class A:\n    x = 1\n    def g(self):\n        return 2\n")
    (tmp_path / "mu_types.py").write_text("LIMIT = 3\nclass B:\n    y: int = 0\n")
    (tmp_path / "mu_unused_types.py").write_text("LIMIT = 4\n")
    modules = {name: (tmp_path / f"{name}.py").resolve()
               for name in ("mu_used", "mu_classes", "mu_types", "mu_unused_types")}
    use = ModuleUse(modules)
    sys.path.insert(0, str(tmp_path))
    try:
        sys.settrace(use._trace)
        try:
            import mu_classes
            import mu_types  # noqa: F401
            import mu_used

            mu_used.f()
            mu_classes.A()  # a class built, no method of it run
        finally:
            sys.settrace(None)
    finally:
        sys.path.remove(str(tmp_path))
        for name in modules:
            sys.modules.pop(name, None)
    assert use.ran == {str(modules["mu_used"])}
    imported = {"mu_used", "mu_classes", "mu_types"}
    assert unexercised(modules, use.ran, imported) == ["mu_classes", "mu_unused_types"]


def test_under_xdist_each_worker_hands_its_modules_to_the_controller_which_judges_them_all(tmp_path: Path) -> None:
    (tmp_path / "mu_a.py").write_text("def f():\n    return 1\n")
    (tmp_path / "mu_b.py").write_text("def g():\n    return 2\n")
    modules = {name: (tmp_path / f"{name}.py").resolve() for name in ("mu_a", "mu_b")}

    class Config:
        def __init__(self, worker: bool) -> None:
            if worker:
                self.workeroutput: dict[str, object] = {}

    class Session:
        def __init__(self, config: Config) -> None:
            self.config = config

    outputs = []
    for name in modules:  # two workers, each running one module's function
        worker = ModuleUse(modules)
        worker.ran.add(str(modules[name]))
        worker.imported.add(name)
        config = Config(worker=True)
        worker.pytest_sessionfinish(Session(config))  # type: ignore[arg-type]
        assert worker.missing == []  # a worker does not judge
        outputs.append(config.workeroutput)
    controller = ModuleUse(modules)
    assert unexercised(modules, controller.ran, controller.imported) == ["mu_a", "mu_b"]

    class Node:
        def __init__(self, out: dict[str, object]) -> None:
            self.workeroutput = out

    controller.pytest_testnodedown(Node(outputs[0]), None)
    assert unexercised(modules, controller.ran, controller.imported) == ["mu_b"]
    controller.pytest_testnodedown(Node(outputs[1]), None)
    assert unexercised(modules, controller.ran, controller.imported) == []
