"""What `pip install .` puts into site-packages: one package named sleuth, nothing at the top named agent, tools or
prompts; no source file imports those folder names as top-level packages; a checkout, which holds no symlink, imports
its own folders as sleuth.agent, sleuth.tools and sleuth.prompts, and mypy checks them under those names."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

from module_use import project_modules

ROOT = Path(__file__).resolve().parents[1]
TOP_LEVEL = re.compile(r"^\s*(from|import)\s+(agent|tools|prompts)(\.|\s|$)", re.M)
FOLDERS = ("agent", "tools", "prompts")


def test_the_wheel_installs_only_the_sleuth_package(tmp_path):
    # Built from a copy of the sources: a checkout's build/ left from an earlier build would go into the wheel too.
    source = tmp_path / "source"
    for name in ("sleuth", *FOLDERS):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--wheel-dir", str(tmp_path), str(source)], check=True, capture_output=True, timeout=300,
                   cwd=tmp_path)
    (wheel,) = tmp_path.glob("sleuth-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names}
    assert {t for t in top if not t.endswith(".dist-info")} == {"sleuth"}, top
    # Package data travels with it: prompts, the packaged worlds and their weights.
    for needed in ("sleuth/prompts/system.md", "sleuth/tools/backends/toyworld/worlds/default.yaml",
                   "sleuth/tools/backends/toyworld/weights/default.safetensors", "sleuth/agent/cli/__init__.py"):
        assert needed in names, needed
    assert len([n for n in names if n.startswith("sleuth/tools/backends/toyworld/weights/random/")]) == 20
    # Every module of the folders, each under sleuth/.
    modules = {f"sleuth/{p.relative_to(ROOT).as_posix()}" for d in FOLDERS for p in (ROOT / d).rglob("*.py")}
    assert modules - set(names) == set()
    entry = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "sleuth = sleuth.agent.cli:entrypoint" in entry


def test_no_source_imports_the_folders_as_top_level_packages():
    offenders = [str(p.relative_to(ROOT)) for d in ("agent", "tools", "prompts", "tests", "scripts", "transcripts")
                 for p in (ROOT / d).rglob("*.py") if TOP_LEVEL.search(p.read_text(encoding="utf-8"))]
    assert offenders == []


def test_the_package_list_names_every_importable_folder():
    listed = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    folders = [p.relative_to(ROOT).parts for d in FOLDERS for p in [ROOT / d, *(ROOT / d).rglob("*")] if p.is_dir()]
    found = {"sleuth"} | {".".join(("sleuth", *parts)) for parts in folders
                          if "__pycache__" not in parts and all(s.isidentifier() for s in parts)}
    assert sorted(found - set(listed)) == [], "add them to [tool.setuptools] packages in pyproject.toml"
    assert sorted(set(listed) - found) == []


def test_the_checkout_holds_no_symlink():
    links = [str(p.relative_to(ROOT)) for d in ("sleuth", *FOLDERS) for p in (ROOT / d).rglob("*") if p.is_symlink()]
    assert links == []


def test_sleuth_imports_the_checkouts_folders(tmp_path):
    """In the tests' environment (the editable install) and with ``PYTHONPATH=<checkout>`` from elsewhere alike."""
    import sleuth.agent
    import sleuth.prompts
    import sleuth.tools

    assert [Path(m.__file__).resolve() for m in (sleuth, sleuth.agent, sleuth.tools, sleuth.prompts)] == \
        [ROOT / d / "__init__.py" for d in ("sleuth", *FOLDERS)]
    probe = "import sleuth.agent, sleuth.prompts, sleuth.tools as t; print(t.__file__, sleuth.agent.__file__)"
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert [Path(f).resolve() for f in out.stdout.split()] == [ROOT / "tools" / "__init__.py",
                                                                ROOT / "agent" / "__init__.py"]


def test_the_type_check_hands_mypy_each_module_under_its_imported_name():
    spec = importlib.util.spec_from_file_location("typecheck", ROOT / "scripts" / "typecheck.py")
    assert spec is not None and spec.loader is not None
    typecheck = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(typecheck)
    paths = {s.module: s.path for s in typecheck.sources()}
    assert paths["sleuth"] == "sleuth/__init__.py"
    assert paths["sleuth.agent.cli.flags"] == "agent/cli/flags.py"
    assert paths["sleuth.prompts"] == "prompts/__init__.py"
    assert project_modules().keys() - paths.keys() == set()
