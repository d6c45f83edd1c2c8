"""Time a no-op `doit` (everything up to date) over the ladder frame; print one JSON line.

Three measurements, each the median wall and CPU (user + sys) time of `--repeats` runs of a fresh
`python -m doit` process (wall time grows with the host's load; CPU time barely does):
  - `frame_ladder_s`: a temporary project with all seven ladder stages declared through pipeline/ (StageSpec, code
    digests, canonical configs, sqlite3 database, md5 checker), chained by file_dep, built once first;
  - `bare_doit_s`: the same seven file tasks declared directly in a plain dodo (doit's own floor on this machine);
  - `repo_list_s`: `doit list` in this repository for profile tiny: loading the real ladder's tasks (code digests of
    every declared worker, configs), without running or building anything.
Target: frame_ladder_s under 1 s.

    .venv/bin/python bench/pipeline_noop.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LADDER = ("ingest", "shards", "sft_checkpoint", "ref_cache", "dpo_checkpoint", "grpo_checkpoint", "golden_eval")

WORKER = """
import os, sys
from dataclasses import dataclass, field
from pathlib import Path
from align.config import load_cli_config
from align.utils.fsio import atomic_write_text

@dataclass(frozen=True)
class IO:
    src: str = ""
    dst: str = ""

@dataclass(frozen=True)
class Cfg:
    io: IO = field(default_factory=IO)

cfg = load_cli_config(Cfg)
text = Path(cfg.io.src).read_text() if cfg.io.src else "seed"
atomic_write_text(cfg.io.dst, text + "+")
"""

FRAME_DODO = """
from pathlib import Path
from pipeline.frame import install
from pipeline.layout import Project
from pipeline.stage import StageSpec

LADDER = {ladder!r}
def out(ctx, name):
    return ctx.layout.runs / name / "out.txt"
STAGES = [StageSpec(name=n, doc=f"bench {{n}}", worker="benchalign.worker", config=f"{{n}}.toml",
                    file_dep=(lambda ctx, p=p: [out(ctx, p)]) if p else (lambda ctx: []),
                    targets=lambda ctx, n=n: [out(ctx, n)])
          for n, p in zip(LADDER, (None,) + LADDER[:-1])]
install(globals(), project=Project(root=Path(__file__).resolve().parent, packages=("benchalign",)),
        stages=STAGES, profile="bench")
"""

BARE_DODO = """
DOIT_CONFIG = {{"backend": "sqlite3", "dep_file": "bare.sqlite3", "verbosity": 0}}
LADDER = {ladder!r}
def _mk(n, p):
    def task():
        return {{"actions": [f"echo x > bare_{{n}}.txt"], "file_dep": [f"bare_{{p}}.txt"] if p else [],
                "targets": [f"bare_{{n}}.txt"], "doc": n, "uptodate": [True]}}
    task.__name__ = "task_" + n
    return task
for _n, _p in zip(LADDER, (None,) + LADDER[:-1]):
    globals()["task_" + _n] = _mk(_n, _p)
"""


def make_project(root: Path) -> None:
    (root / "benchalign").mkdir()
    (root / "benchalign" / "__init__.py").write_text("")
    (root / "benchalign" / "worker.py").write_text(WORKER)
    (root / "dodo.py").write_text(textwrap.dedent(FRAME_DODO.format(ladder=LADDER)))
    (root / "bare.py").write_text(textwrap.dedent(BARE_DODO.format(ladder=LADDER)))
    cfgs = root / "configs" / "bench"
    cfgs.mkdir(parents=True)
    (cfgs / "common.toml").write_text("[run]\nseed = 1\n")
    for name, prev in zip(LADDER, (None,) + LADDER[:-1]):
        src = f"runs/bench/{prev}/out.txt" if prev else ""
        (cfgs / f"{name}.toml").write_text(f'[io]\nsrc = "{src}"\ndst = "runs/bench/{name}/out.txt"\n')


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def time_doit(args: list[str], cwd: Path, repeats: int, check_noop: bool = True) -> tuple[float, float]:
    """(median wall seconds, median CPU seconds) of `python -m doit ARGS`; CPU time does not grow with host load."""
    times, cpus = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), _children_cpu()
        res = subprocess.run([sys.executable, "-m", "doit", *args], cwd=cwd, capture_output=True, text=True)
        times.append(time.perf_counter() - t0)
        cpus.append(_children_cpu() - c0)
        if res.returncode != 0 or (check_noop and "\n." in "\n" + res.stdout):  # ".": a task ran, not a no-op
            raise SystemExit(f"doit {' '.join(args)} in {cwd} was not a no-op:\n{res.stdout}\n{res.stderr}")
    return statistics.median(times), statistics.median(cpus)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    ns = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        make_project(root)
        for dodo in ("dodo.py", "bare.py"):  # the first build
            res = subprocess.run([sys.executable, "-m", "doit", "-f", dodo], cwd=root, capture_output=True, text=True)
            if res.returncode != 0:
                raise SystemExit(f"first build of {dodo} failed:\n{res.stdout}\n{res.stderr}")
        frame = time_doit(["-f", "dodo.py"], root, ns.repeats)
        bare = time_doit(["-f", "bare.py"], root, ns.repeats)
    repo = time_doit(["-f", str(REPO / "dodo.py"), "profile=tiny", "list"], REPO, ns.repeats, check_noop=False)
    print(json.dumps({"bench": "pipeline_noop", "stages": len(LADDER),
                      "frame_ladder_s": round(frame[0], 3), "frame_ladder_cpu_s": round(frame[1], 3),
                      "bare_doit_s": round(bare[0], 3), "bare_doit_cpu_s": round(bare[1], 3),
                      "repo_list_s": round(repo[0], 3), "repo_list_cpu_s": round(repo[1], 3), "target_s": 1.0,
                      "repeats": ns.repeats, "cpus": os.cpu_count(), "load1": round(os.getloadavg()[0], 2),
                      "python": sys.version.split()[0]}))


if __name__ == "__main__":
    main()
