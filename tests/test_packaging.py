"""What `pip install .` puts into site-packages: one package named sleuth, nothing at the top named agent, tools or
prompts; and no source file imports those folder names as top-level packages."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOP_LEVEL = re.compile(r"^\s*(from|import)\s+(agent|tools|prompts)(\.|\s|$)", re.M)


def test_the_wheel_installs_only_the_sleuth_package(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--wheel-dir", str(tmp_path), str(ROOT)], check=True, capture_output=True, timeout=300,
                   cwd=tmp_path)
    (wheel,) = tmp_path.glob("sleuth-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names}
    assert {t for t in top if not t.endswith(".dist-info")} == {"sleuth"}, top
    # Package data travels with it: prompts, the packaged worlds and their weights.
    for needed in ("sleuth/prompts/system.md", "sleuth/tools/backends/toyworld/worlds/default.yaml",
                   "sleuth/tools/backends/toyworld/weights/default.safetensors", "sleuth/agent/cli/__init__.py"):
        assert needed in names, needed
    entry = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "sleuth = sleuth.agent.cli:entrypoint" in entry


def test_no_source_imports_the_folders_as_top_level_packages():
    offenders = [str(p.relative_to(ROOT)) for d in ("agent", "tools", "prompts", "tests", "scripts", "transcripts")
                 for p in (ROOT / d).rglob("*.py") if TOP_LEVEL.search(p.read_text(encoding="utf-8"))]
    assert offenders == []
