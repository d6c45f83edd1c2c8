"""Where everything lives, as pure path arithmetic (no file is touched here).

    <root>/configs/<profile>/common.toml      shared tables of the profile ([run], [preflight], [lock], [supervisor])
    <root>/configs/<profile>/<stage>.toml     one config per stage
    <root>/runs/<profile>/<stage>[/<variant>] a stage's run directory (worker.log, HALT.json, its artifacts)
    <root>/runs/<profile>/receipts/<task>.json
    <root>/runs/<profile>/.doit.sqlite3       doit's dependency database for the profile"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def relative_to_root(path: str | Path, root: Path) -> str:
    """`path` relative to the project root when inside it. Workers run in the root, and relative paths keep a task's
    identity and its receipts the same when the checkout moves."""
    try:
        return Path(path).resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return str(path)


@dataclass(frozen=True)
class Project:
    """A tree that holds configs/ and runs/, the packages whose code digests count, and the Python to launch."""

    root: Path = REPO_ROOT
    packages: tuple[str, ...] = ("align",)
    python: str = field(default_factory=lambda: sys.executable)


@dataclass(frozen=True)
class Layout:
    project: Project
    profile: str

    @property
    def root(self) -> Path:
        return self.project.root

    @property
    def configs(self) -> Path:
        return self.root / "configs" / self.profile

    @property
    def common_config(self) -> Path:
        return self.configs / "common.toml"

    @property
    def runs(self) -> Path:
        return self.root / "runs" / self.profile

    @property
    def receipts(self) -> Path:
        return self.runs / "receipts"

    @property
    def db_file(self) -> Path:
        return self.runs / ".doit.sqlite3"

    def stage_dir(self, stage: str, variant: str | None = None) -> Path:
        return self.runs / stage / variant if variant else self.runs / stage

    def receipt(self, task: str) -> Path:
        return self.receipts / (task.replace(":", "-") + ".json")


@dataclass(frozen=True)
class StageCtx:
    """What a stage declaration's functions receive: the profile's layout, the stage and (for a stage with
    variants, such as `ingest:<source>`) the variant."""

    layout: Layout
    stage: str
    variant: str | None = None

    @property
    def profile(self) -> str:
        return self.layout.profile

    @property
    def runs(self) -> Path:
        return self.layout.runs

    @property
    def configs(self) -> Path:
        return self.layout.configs

    @property
    def run_dir(self) -> Path:
        return self.layout.stage_dir(self.stage, self.variant)

    @property
    def task(self) -> str:
        return f"{self.stage}:{self.variant}" if self.variant else self.stage

    @property
    def receipt(self) -> Path:
        return self.layout.receipt(self.task)

    def stage_dir(self, stage: str, variant: str | None = None) -> Path:
        """Run directory of another stage (an upstream one, for `file_dep`)."""
        return self.layout.stage_dir(stage, variant)
