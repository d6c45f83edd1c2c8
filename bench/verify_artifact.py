"""Cost of verifying an artifact against its manifest (align.utils.manifest.verify_artifact); print one JSON line.

A checkpoint-like artifact of `--gib` GiB (a 7B model in bf16 is ~14 GiB: four ~3.5 GiB shards plus small files)
is written and its manifest made; then, each in a fresh process:
  - `first_verify_s`: the first verification (every file hashed: what a consumer pays once per new artifact;
    the files are in the page cache, as right after publication);
  - `cached_verify_s`: the next one (the stat cache answers: one stat per file);
  - `sha256sum_s`: coreutils `sha256sum` over the same files, the reference floor for hashing them.
The files are deleted afterwards.

    .venv/bin/python bench/verify_artifact.py [--gib 14] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHILD = """
import sys, time
from align.utils.manifest import verify_artifact
t = time.perf_counter()
verify_artifact(sys.argv[1], cache_dir=sys.argv[2])
print(time.perf_counter() - t)
"""


def write_artifact(root: Path, gib: float) -> int:
    root.mkdir(parents=True)
    block = os.urandom(64 << 20)
    total = int(gib * (1 << 30))
    shards = 4
    per = total // shards
    for i in range(shards):
        with open(root / f"model-{i + 1:05d}-of-{shards:05d}.safetensors", "wb") as f:
            left = per
            while left > 0:
                f.write(block[: min(left, len(block))])
                left -= len(block)
    (root / "config.json").write_text("{}")
    return per * shards


def timed_child(art: Path, cache: Path) -> float:
    out = subprocess.run([sys.executable, "-c", CHILD, str(art), str(cache)], capture_output=True, text=True,
                         check=True, env=dict(os.environ, PYTHONPATH=str(REPO)), cwd=REPO)
    return float(out.stdout.strip())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gib", type=float, default=14.0)
    parser.add_argument("--dir", default=tempfile.gettempdir())
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from align.utils import stat_cache
    from align.utils.manifest import write_manifest

    work = Path(tempfile.mkdtemp(prefix="verify-bench-", dir=args.dir))
    try:
        art = work / "final"
        nbytes = write_artifact(art, args.gib)
        t = time.perf_counter()
        write_manifest(art, "checkpoint")
        manifest_s = time.perf_counter() - t
        time.sleep(stat_cache.RACY_NS / 1e9 + 0.5)  # past the racy window, as any consumer after publication is
        cache = work / "stat_cache"
        first = timed_child(art, cache)
        cached = timed_child(art, cache)
        t = time.perf_counter()
        subprocess.run(["sha256sum", *sorted(str(p) for p in art.glob("*.safetensors"))], check=True,
                       capture_output=True)
        reference = time.perf_counter() - t
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps({"bench": "verify_artifact", "gib": round(nbytes / (1 << 30), 2), "files": 5,
                      "write_manifest_s": round(manifest_s, 2), "first_verify_s": round(first, 2),
                      "first_verify_gb_s": round(nbytes / first / 1e9, 2), "cached_verify_s": round(cached, 4),
                      "sha256sum_s": round(reference, 2), "cpus": os.cpu_count(),
                      "load1": round(os.getloadavg()[0], 2)}))


if __name__ == "__main__":
    main()
