"""A test-only two-stage ladder in a temporary project: `ingest` upper-cases a text file, `shards` counts its
characters. Real doit, real launcher, real subprocess workers; the workers import only stdlib + align (no torch),
so a doit run costs well under a second."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from align.utils.fsio import atomic_write_text

FILES = {
    "dodo.py": """
        from pathlib import Path
        from pipeline.frame import install
        from pipeline.layout import Project
        from toy_stages import STAGES

        install(globals(), project=Project(root=Path(__file__).resolve().parent, packages=("toyalign",)),
                stages=STAGES)
    """,
    "toy_stages.py": """
        import os
        from pipeline.stage import StageSpec

        STAGES = [
            StageSpec(name="ingest", doc="upper-case the input text", worker="toyalign.stages.ingest",
                      config="ingest.toml", file_dep=lambda ctx: [ctx.layout.root / "data" / "in.txt"],
                      targets=lambda ctx: [ctx.run_dir / "out" / "manifest.json"]),
            StageSpec(name="shards", doc="count the characters", worker="toyalign.stages.shards",
                      config="shards.toml", heavy=True, distributed=True,
                      file_dep=lambda ctx: [ctx.stage_dir("ingest") / "out" / "manifest.json"],
                      targets=lambda ctx: [ctx.run_dir / "out" / "manifest.json"]),
        ]
        if os.environ.get("TOY_EXTRA"):  # a side rung: built only when asked for by name
            STAGES.append(StageSpec(name="ppo_checkpoint", doc="an extra rung", worker="toyalign.stages.shards",
                                    config="shards.toml", extra=True,
                                    file_dep=lambda ctx: [ctx.stage_dir("ingest") / "out" / "manifest.json"],
                                    targets=lambda ctx: [ctx.run_dir / "out" / "manifest.json"]))
        if os.environ.get("TOY_BLOCKED"):  # a stage whose upstream is not declared (an incomplete ladder)
            STAGES.append(StageSpec(name="sft_checkpoint", doc="needs an undeclared upstream",
                                    worker="toyalign.stages.shards", config="shards.toml",
                                    file_dep=lambda ctx: [ctx.stage_dir("pretrain") / "manifest.json"],
                                    targets=lambda ctx: [ctx.run_dir / "out" / "manifest.json"]))
    """,
    "toyalign/__init__.py": "",
    "toyalign/stages/__init__.py": "",
    "toyalign/common.py": """
        import os, time
        from dataclasses import dataclass, field
        from pathlib import Path

        from align.config import load_cli_config, run_dir_from_env, write_resolved_config
        from align.utils.fsio import atomic_write_json, publish_dir, staging_dir
        from align.utils.manifest import write_manifest


        @dataclass(frozen=True)
        class Job:
            suffix: str = "!"
            sleep_s: float = 0.0  # pause after the first write (a window to kill the worker mid-write)
            fail: bool = False
            checkpoint: bool = False  # publish run_dir/checkpoints/step_1 (with its manifest) before the pause


        @dataclass(frozen=True)
        class ToyConfig:
            job: Job = field(default_factory=Job)


        def run(stage, transform, source):
            cfg = load_cli_config(ToyConfig)
            run_dir = run_dir_from_env("runs/toy/" + stage)
            rank = int(os.environ.get("RANK", "0"))  # set by torchrun; rank 0 publishes
            with open(Path(os.environ["ALIGN_RUNS_DIR"]) / "calls.log", "a") as f:
                f.write((stage if rank == 0 else f"{stage}@{rank}") + "\\n")
            if rank != 0:
                return 0
            out = run_dir / "out"
            staging = staging_dir(out)
            (staging / "data.txt").write_text(transform(Path(source(run_dir)).read_text(), cfg.job))
            if cfg.job.checkpoint:
                ckpt = staging_dir(run_dir / "checkpoints" / "step_1")
                (ckpt / "state.txt").write_text("step 1")
                write_manifest(ckpt, "train_checkpoint")
                publish_dir(ckpt, run_dir / "checkpoints" / "step_1")
            if cfg.job.sleep_s:
                (run_dir / "WRITING").write_text(str(os.getpid()))
                time.sleep(cfg.job.sleep_s)
            if cfg.job.fail:
                raise RuntimeError("injected failure after writing")
            write_manifest(staging, "toy")
            publish_dir(staging, out)
            write_resolved_config(cfg, run_dir)
            atomic_write_json(run_dir / "metrics.json", {"chars": len((out / "data.txt").read_text())})
            return 0
    """,
    "toyalign/shout.py": """
        def shout(text, job):
            return text.upper() + job.suffix
    """,
    "toyalign/tally.py": """
        def tally(text, job):
            return f"{len(text)}{job.suffix}"
    """,
    "toyalign/stages/ingest.py": """
        from align.exit_codes import run_with_exit_codes
        from toyalign.common import run
        from toyalign.shout import shout

        if __name__ == "__main__":
            raise SystemExit(run_with_exit_codes(lambda: run("ingest", shout, lambda d: "data/in.txt")))
    """,
    "toyalign/stages/shards.py": """
        from align.exit_codes import run_with_exit_codes
        from toyalign import common
        from .. import tally

        if __name__ == "__main__":
            raise SystemExit(run_with_exit_codes(
                lambda: common.run("shards", tally.tally, lambda d: d.parent / "ingest" / "out" / "data.txt")))
    """,
    "configs/toy/common.toml": """
        [run]
        seed = 1

        [preflight]
        min_mem_available_gib = 0.01
        min_free_disk_gib = 0.001

        [lock]
        path = "heavy.lock"

        [supervisor]
        max_retries = 2
        backoff_s = 0.0
        kill_grace_s = 2.0
    """,
    "configs/toy/ingest.toml": """
        include = "job.toml"
    """,
    "configs/toy/job.toml": """
        [job]
        suffix = "!"
    """,
    "configs/toy/shards.toml": """
        # shards config
        [job]
        suffix = "#"
    """,
    "data/in.txt": "hello ladder",
}


def make_toy(root: Path) -> Path:
    for rel, text in FILES.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip())
    return root


def write(root: Path, rel: str, text: str) -> None:
    atomic_write_text(root / rel, textwrap.dedent(text).lstrip())


def doit(root: Path, *args: str, timeout: float = 120, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", **(env_extra or {}))
    env.pop("ALIGN_HEAVY_LOCK", None)
    return subprocess.run([sys.executable, "-m", "doit", "-f", str(root / "dodo.py"), "profile=toy", *args],
                          cwd=root, capture_output=True, text=True, env=env, timeout=timeout)


def calls(root: Path) -> list[str]:
    path = root / "runs" / "toy" / "calls.log"
    return path.read_text().split() if path.exists() else []


def ran(root: Path, before: list[str]) -> list[str]:
    """Stages whose worker ran since `before = calls(root)` was taken."""
    return calls(root)[len(before):]
