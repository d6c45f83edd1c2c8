"""Run identity: what makes two attempts of a training stage the same run, so one may resume the other's checkpoint.

A training stage resumes from its own newest checkpoint (a retry after a crash, a signal, a wall budget). That is
right only when the attempt trains the same thing: the same config and the same inputs. When the config or an
input changed (a new beta, new shards, a new start checkpoint), the old checkpoints belong to another run, and
resuming them would publish a hybrid whose provenance is a lie. The Trainer compares the identity recorded in the
checkpoint manifest with the current one and starts fresh on any difference (align.train.trainer).

The identity is a digest of the resolved config without the keys that only say how the run is operated (checkpoint
cadence and retention, wall budget, collective timeout, host preflight, lock, supervisor) plus the digests of the
stage's inputs. `max_steps` is part of it: the learning-rate schedule depends on it, so a longer run is a new run.
Under the pipeline the launcher also passes the stage's code digest ($ALIGN_CODE_DIGEST, the import closure doit
tracks), so a code change that makes doit rerun a stage also makes it train afresh; a bare `python -m` run has no
code digest and resumes whatever the config and inputs match."""

from __future__ import annotations

import json
import os
from typing import Any

from align.config import to_dict
from align.utils.fsio import sha256_bytes

CODE_DIGEST_ENV = "ALIGN_CODE_DIGEST"

# Dotted config keys that never change what is trained: an attempt that differs only in these resumes.
OPERATIONAL_KEYS = ("train.checkpoint_every", "train.keep_last", "train.pin_every", "train.max_wall_seconds",
                    "train.pg_timeout_after_first_step_s", "train.checkpoint_format", "preflight", "lock",
                    "supervisor")


def _drop(tree: dict, dotted: str) -> None:
    *parents, leaf = dotted.split(".")
    for key in parents:
        tree = tree.get(key)
        if not isinstance(tree, dict):
            return
    tree.pop(leaf, None)


def run_identity(cfg: Any, inputs: dict[str, str]) -> dict[str, Any]:
    """{"config": digest of the training-relevant config, "inputs": {name: digest}} (JSON-plain, small)."""
    tree = to_dict(cfg)
    for key in OPERATIONAL_KEYS:
        _drop(tree, key)
    config = sha256_bytes(json.dumps(tree, sort_keys=True, default=str).encode("utf-8"))
    inputs = dict(inputs)
    if os.environ.get(CODE_DIGEST_ENV):
        inputs["code"] = os.environ[CODE_DIGEST_ENV]
    return {"config": config, "inputs": dict(sorted((k, str(v)) for k, v in inputs.items()))}


def identity_difference(stored: dict | None, current: dict) -> str | None:
    """Why a checkpoint written under `stored` is not a checkpoint of the run `current`, or None when it is."""
    if stored is None:
        return "the checkpoint records no run identity (written by an older align)"
    changed = []
    if stored.get("config") != current["config"]:
        changed.append("config")
    old, new = stored.get("inputs", {}), current["inputs"]
    changed += [f"input {name!r}" for name in sorted(set(old) | set(new)) if old.get(name) != new.get(name)]
    return f"changed since it was written: {', '.join(changed)}" if changed else None
