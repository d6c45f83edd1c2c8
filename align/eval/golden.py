"""Golden regression: the greedy decode of a fixed prompt set, hashed and compared with committed anchors.

An anchor (`<anchors>/<stage>.json`, committed under `configs/<profile>/golden/`) holds one entry per recorded
checkpoint: the decoded text of every golden prompt, the hash of those texts, the content hash of the checkpoint
that produced them and the host that trained it. Greedy decoding is deterministic and the engine's native kernels
give the same bits on every x86 ISA (tests/inference/test_native_kernels.py, tests/eval/test_golden_host.py), so
the same code and checkpoint must reproduce an entry exactly on any host. Training is not host-independent (CPU
BLAS kernels differ between ISAs and vendors, so 960 steps land on other weights): an anchor may therefore hold the
checkpoints of several hosts (`accept --add`), and a host that trains one of them is checked exactly. Verdicts:

    match               the texts equal those of the entry with this checkpoint, or of any entry (the only pass)
    mismatch            a recorded checkpoint, different texts: the decode path (engine, model, tokenizer) changed
    checkpoint_changed  an unrecorded checkpoint with other texts: training changed, or this host trains
                        differently (the receipt names the recorded hosts); accept it explicitly
    prompts_changed     the golden prompt set itself differs from the anchor's (eval data or tokenizer changed)
    no_anchor           nothing committed yet for this stage

Every failing verdict with texts to compare carries a unified diff of the first differing sample. Anchors change
only through the explicit command (nothing in the ladder writes them):

    .venv/bin/python -m align.eval.golden accept --profile smoke [--stage sft ...]

which makes `runs/<profile>/golden_eval/<stage>/out/golden.json` the anchor's only entry, or with `--add` adds it
beside the entries of other hosts' checkpoints."""

from __future__ import annotations

import argparse
import difflib
import json
import os
import platform
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from align.config import read_toml
from align.utils.fsio import atomic_write_json, sha256_bytes

FORMAT = 2  # an anchor: entries per checkpoint; format 1 (one record) is still read
RECORD_FORMAT = 1  # one decode (golden.json)
GOLDEN_FILE = "golden.json"  # the stage's own decode, published in its out/ directory
DIFF_LINES = 40  # a diff longer than this is cut: the first lines say enough


@dataclass(frozen=True)
class GoldenConfig:
    """[golden] table."""

    prompts: int = 16  # the first N rows of the eval split
    max_new_tokens: int = 64
    anchors: str = ""  # anchor directory relative to the project root (configs/<profile>/golden); "" = no check


def texts_hash(samples: Sequence[dict]) -> str:
    return sha256_bytes(json.dumps([[s["id"], s["text"]] for s in samples], ensure_ascii=False).encode())


def prompts_hash(samples: Sequence[dict]) -> str:
    return sha256_bytes(json.dumps([[s["id"], s["prompt_sha256"]] for s in samples]).encode())


def golden_record(stage: str, checkpoint_hash: str, samples: Sequence[dict], host: dict | None = None) -> dict:
    """`samples`: [{"id", "prompt_sha256", "text", "tokens"}] in prompt order; `host`: where it was made."""
    return {"format": RECORD_FORMAT, "stage": stage, "checkpoint_content_hash": checkpoint_hash,
            "prompts_sha256": prompts_hash(samples), "texts_sha256": texts_hash(samples), "host": host or {},
            "samples": list(samples)}


def host_label() -> dict:
    """What distinguishes hosts whose training differs: the CPU model and the ISA torch and the native kernels use."""
    import torch  # here: the anchors' CLI (accept) needs no torch

    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    return {"cpu": cpu or platform.processor(), "aten_capability": torch.backends.cpu.get_cpu_capability(),
            "native_march": os.environ.get("ALIGN_NATIVE_MARCH", "native"), "torch": torch.__version__}


def anchor_of(entries: Sequence[dict]) -> dict:
    return {"format": FORMAT, "stage": entries[0]["stage"], "prompts_sha256": entries[0]["prompts_sha256"],
            "entries": list(entries)}


def first_diff(anchor: Sequence[dict], current: Sequence[dict]) -> tuple[int, dict | None]:
    """(number of differing samples, {"id", "diff"} for the first one or None)."""
    differing = [(a, c) for a, c in zip(anchor, current) if a["text"] != c["text"]]
    if not differing:
        return 0, None
    a, c = differing[0]
    lines = list(difflib.unified_diff(a["text"].splitlines(), c["text"].splitlines(), "anchor", "current",
                                      lineterm="", n=2))
    return len(differing), {"id": c["id"], "diff": "\n".join(lines[:DIFF_LINES])}


def compare(current: dict, anchor: dict | None) -> dict:
    """The golden section of an evaluation receipt: verdict, `passed`, hashes, first differing sample."""
    out = {"texts_sha256": current["texts_sha256"], "prompts": len(current["samples"])}
    if anchor is None:
        return {**out, "status": "no_anchor", "passed": False}
    entries = anchor["entries"] if "entries" in anchor else [anchor]  # an anchor, or a single record
    same = [e for e in entries if e.get("checkpoint_content_hash") == current["checkpoint_content_hash"]]
    ref = same[0] if same else next((e for e in entries if e["texts_sha256"] == current["texts_sha256"]), entries[0])
    out |= {"anchor_texts_sha256": ref.get("texts_sha256"),
            "anchor_checkpoint_content_hash": ref.get("checkpoint_content_hash"),
            "recorded_checkpoint": bool(same), "anchor_hosts": [e.get("host", {}) for e in entries]}
    if anchor.get("prompts_sha256") != current["prompts_sha256"]:
        return {**out, "status": "prompts_changed", "passed": False}
    if ref.get("texts_sha256") == current["texts_sha256"]:
        return {**out, "status": "match", "passed": True, "differing": 0}
    count, diff = first_diff(ref["samples"], current["samples"])
    return {**out, "status": "mismatch" if same else "checkpoint_changed", "passed": False,
            "differing": count, "first_diff": diff}


def read_anchor(path: Path) -> dict | None:
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    if data.get("format") == RECORD_FORMAT:  # a single decode: the anchor of one checkpoint
        return anchor_of([data])
    if data.get("format") != FORMAT or not data.get("entries"):
        raise ValueError(f"{path}: golden anchor format {data.get('format')!r}, expected {FORMAT} with entries "
                         f"(or {RECORD_FORMAT})")
    return data


# ---------------------------------------------------------------------------------------- the explicit command


def anchors_dir(root: Path, profile: str) -> Path:
    cfg = read_toml(root / "configs" / profile / "golden_eval.toml")
    anchors = cfg.get("golden", {}).get("anchors", "")
    if not anchors:
        raise SystemExit(f"configs/{profile}/golden_eval.toml: [golden].anchors is empty: no anchors to update")
    return root / anchors


def accept(root: Path, profile: str, stages: Sequence[str] = (), add: bool = False) -> list[str]:
    """Make each stage's latest golden decode its anchor (`add`: beside the other checkpoints' entries, replacing
    only an entry of the same checkpoint); returns one line per stage."""
    base = root / "runs" / profile / "golden_eval"
    found = sorted(p.parent.parent.name for p in base.glob(f"*/out/{GOLDEN_FILE}"))
    chosen = list(stages) or found
    missing = [s for s in chosen if s not in found]
    if missing or not chosen:
        raise SystemExit(f"no golden decode for {', '.join(missing) or 'any stage'} under {base}: run "
                         f"`doit profile={profile} golden_eval` first")
    target = anchors_dir(root, profile)
    lines = []
    for stage in chosen:
        current = json.loads((base / stage / "out" / GOLDEN_FILE).read_text())
        old = read_anchor(target / f"{stage}.json")
        verdict = compare(current, old)
        if verdict["status"] == "match" and verdict["recorded_checkpoint"] and (add or len(old["entries"]) == 1):
            lines.append(f"{stage}: unchanged")
            continue
        keep = [e for e in old["entries"] if e["checkpoint_content_hash"] != current["checkpoint_content_hash"]
                ] if add and old is not None and verdict["status"] != "prompts_changed" else []
        target.mkdir(parents=True, exist_ok=True)
        atomic_write_json(target / f"{stage}.json", anchor_of([*keep, current]))
        lines.append(f"{stage}: anchor {'entry added' if keep else 'updated'} ({verdict['status']} before, "
                     f"{len(keep) + 1} checkpoint(s)) -> {target / f'{stage}.json'}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m align.eval.golden", description="update golden anchors")
    sub = parser.add_subparsers(dest="command", required=True)
    acc = sub.add_parser("accept", help="make the latest golden decodes of a profile its committed anchors")
    acc.add_argument("--profile", default="tiny")
    acc.add_argument("--stage", action="append", default=[], help="a rung (sft, dpo, grpo); default: all built")
    acc.add_argument("--root", default=".", help="project root")
    acc.add_argument("--add", action="store_true",
                     help="keep the entries of other checkpoints (another host's training) beside this one")
    ns = parser.parse_args(argv)
    for line in accept(Path(ns.root), ns.profile, ns.stage, ns.add):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
