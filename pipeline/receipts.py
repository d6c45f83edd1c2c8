"""Receipts: what a task read, what it wrote, with which code and config, how long it took.

`runs/<profile>/receipts/<task>.json` is written by the launcher after the worker exited 0 and every target was
found, atomically, last: a receipt on disk means its outputs were complete when it was written."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable

from align.utils.fsio import atomic_write_json, sha256_file
from pipeline.layout import relative_to_root

METRICS_FILE = "metrics.json"  # a worker may publish `<run_dir>/metrics.json`; it lands in the receipt's metrics


def hash_paths(paths: Iterable[Path], root: Path) -> dict[str, str]:
    return {relative_to_root(p, root): sha256_file(p) for p in paths}


def read_metrics(run_dir: Path) -> dict:
    path = run_dir / METRICS_FILE
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object of metrics")
    return data


def write_receipt(path: Path, *, task: str, profile: str, root: Path, inputs: Iterable[Path],
                  outputs: Iterable[Path], code_digest: str, config_digest: str, config: str, metrics: dict,
                  wall_s: float, extra: dict | None = None) -> dict:
    receipt = {
        "task": task,
        "profile": profile,
        "inputs": hash_paths(inputs, root),
        "outputs": hash_paths(outputs, root),
        "code_digest": code_digest,
        "config_digest": config_digest,
        "config": config,
        "metrics": metrics,
        "wall_s": round(wall_s, 3),
        "finished": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        **(extra or {}),
    }
    atomic_write_json(path, receipt)
    return receipt


def read_receipt(path: Path) -> dict:
    return json.loads(Path(path).read_text())
