"""A private copy of the project for running the real ladder under real doit: its own `align/` and `pipeline/`
(copies, so a test may edit the code), `configs/<profile>/`, `data/raw/` (copies, so it may edit them), the vendored
tokenizer (a link: never edited) and a dodo file rooted in the copy, so `runs/` lands there too."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DODO = """
from pathlib import Path
from pipeline.frame import install
from pipeline.layout import Project

install(globals(), project=Project(root=Path(__file__).resolve().parent))
"""
IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc")


def make_project(root: Path, profile: str = "smoke") -> Path:
    for package in ("align", "pipeline"):
        shutil.copytree(REPO / package, root / package, ignore=IGNORE)
    shutil.copytree(REPO / "configs" / profile, root / "configs" / profile)
    shutil.copytree(REPO / "data" / "raw", root / "data" / "raw")
    (root / "assets").symlink_to(REPO / "assets")
    (root / "dodo.py").write_text(DODO)
    return root


@dataclass(frozen=True)
class DoitRun:
    returncode: int
    ran: list[str]  # tasks whose action ran, in order
    up_to_date: list[str]
    output: str


def doit(root: Path, *args: str, profile: str = "smoke", timeout: float = 1800) -> DoitRun:
    """Run the real doit on the copy; what ran is read from doit's own lines (`.  task` ran, `-- task` skipped)."""
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", ALIGN_HEAVY_LOCK=str(root / "heavy.lock"))
    proc = subprocess.run([sys.executable, "-m", "doit", "-f", str(root / "dodo.py"), f"profile={profile}", *args],
                          cwd=root, capture_output=True, text=True, env=env, timeout=timeout)
    return DoitRun(proc.returncode, re.findall(r"^\.  (\S+)$", proc.stdout, re.M),
                   re.findall(r"^-- (\S+)$", proc.stdout, re.M), proc.stdout + proc.stderr)
