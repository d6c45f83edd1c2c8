"""Shard-build throughput: tokens/s of `align.data.shard_build` on the bundled math task and on synthetic text.

Prints one JSON line. For each corpus: ingest wall time, then the shard build with 1 and with 2 worker processes
(tokens/s = tokens written / build wall time, tokenizer loading included), and, when the `tokenizers` library is
installed, its Rust `encode_batch` over the same chat-formatted strings on 2 threads (the reference).

The synthetic corpus: SFT conversations of Zipf-distributed made-up words (a 20,000-word vocabulary), so the BPE
word cache sees a realistic mix of hits and misses; `--synthetic-mb` sets its size in MB of text.

    .venv/bin/python bench/shards_build.py --synthetic-mb 50
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from align.data.ingest_parquet import SourceConfig, ingest_source  # noqa: E402
from align.data.shard_build import ShardBuildConfig, build_shards  # noqa: E402
from align.data.encoding import EncodingConfig  # noqa: E402
from align.tokenizer import TokenizerConfig  # noqa: E402

BUNDLED = {"math_sft": ("sft", "messages"), "math_pairs": ("pairs", "pair_columns"),
           "math_rl": ("prompts", "prompt_answer"), "math_eval": ("prompts", "prompt_answer")}


def synthetic_parquet(path: Path, megabytes: float, seed: int = 0) -> int:
    """Write prompt/response rows of made-up Zipfian words until `megabytes` of text; returns the row count."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    vocab = ["".join(rng.choice(letters, size=rng.integers(2, 10))) for _ in range(20_000)]
    target, size, rows = megabytes * 1e6, 0, []
    while size < target:
        words = rng.zipf(1.3, size=400) % len(vocab)
        text = " ".join(vocab[w] for w in words)
        cut = len(text) // 4
        rows.append({"prompt": text[:cut].capitalize() + "?", "response": text[cut:].capitalize() + "."})
        size += len(text)
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=1024)
    return len(rows)


def _build(records: Path, out: Path, workers: int) -> dict:
    cfg = ShardBuildConfig(encoding=EncodingConfig(max_len=4096), workers=workers)
    t0 = time.perf_counter()
    manifest = build_shards(records, out, TokenizerConfig(), cfg)
    wall = time.perf_counter() - t0
    return {"workers": workers, "wall_s": round(wall, 2), "tokens": manifest["tokens"],
            "tokens_per_s": round(manifest["tokens"] / wall)}


def _reference(records_dirs: list[Path]) -> dict | None:
    """`tokenizers` encode_batch over the same chat strings, 2 threads."""
    try:
        from tokenizers import Tokenizer as HFTokenizer
    except ImportError:
        return None
    os.environ.setdefault("RAYON_NUM_THREADS", "2")
    hf = HFTokenizer.from_file(str(ROOT / "assets/tokenizer/mistral-7b-v0.3/tokenizer.json"))
    texts = []
    for directory in records_dirs:
        for row in pq.read_table(directory / "records.parquet").to_pylist():
            turns = row.get("messages") or row["prompt"]
            text = "<s>" + "".join(f"[INST] {m['content']}[/INST]" if m["role"] == "user" else f" {m['content']}</s>"
                                   for m in turns)
            replies = [row["chosen"], row["rejected"]] if row.get("chosen") else [None]
            texts += [text + (f" {reply}</s>" if reply else "") for reply in replies]
    t0 = time.perf_counter()
    tokens = sum(len(e.ids) for e in hf.encode_batch(texts, add_special_tokens=False))
    wall = time.perf_counter() - t0
    return {"library": "tokenizers", "threads": int(os.environ["RAYON_NUM_THREADS"]), "wall_s": round(wall, 2),
            "tokens": tokens, "tokens_per_s": round(tokens / wall)}


def _corpus(tmp: Path, sources: dict[str, SourceConfig]) -> dict:
    t0 = time.perf_counter()
    dirs = []
    for name, src in sources.items():
        ingest_source(name, src, tmp / f"{name}-records")
        dirs.append(tmp / f"{name}-records")
    ingest_s = time.perf_counter() - t0
    result = {"ingest_s": round(ingest_s, 2), "builds": []}
    for workers in (1, 2):
        runs = [_build(d, tmp / f"{d.name}-shards-{workers}", workers) for d in dirs]
        wall = sum(r["wall_s"] for r in runs)
        tokens = sum(r["tokens"] for r in runs)
        result["builds"].append({"workers": workers, "wall_s": round(wall, 2), "tokens": tokens,
                                 "tokens_per_s": round(tokens / wall)})
    result["reference"] = _reference(dirs)
    return result


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--synthetic-mb", type=float, default=50.0, help="0 skips the synthetic corpus")
    args = ap.parse_args()
    out = {"bench": "shards_build", "cpus": os.cpu_count(),
           "malloc": os.environ.get("MALLOC_MMAP_MAX_", "default glibc")}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        bundled = {name: SourceConfig(path=str(ROOT / "data/raw" / f"{name}.parquet"), kind=kind, format=fmt,
                                      id_column="id", group_column="level")
                   for name, (kind, fmt) in BUNDLED.items()}
        out["bundled"] = _corpus(tmp / "bundled", bundled)
        if args.synthetic_mb > 0:
            (tmp / "synthetic").mkdir()
            rows = synthetic_parquet(tmp / "synthetic" / "text.parquet", args.synthetic_mb)
            src = {"synthetic": SourceConfig(path=str(tmp / "synthetic" / "text.parquet"), kind="sft",
                                             format="prompt_response", batch_rows=1024)}
            out["synthetic"] = {"megabytes": args.synthetic_mb, "rows": rows, **_corpus(tmp / "synthetic", src)}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
