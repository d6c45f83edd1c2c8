"""Decontamination speed (align.data.decontam): records checked per second against the evaluation sets' n-gram index.

Three measurements on the bundled data, all in one process on the CPU:
  - `match` alone on the bundled SFT conversations (short: ~25 words) against the registered "bundled" set (600
    held-out problems), and against a 6,600-item reference set (the held-out problems plus the 6,000 RL prompts as
    stand-in eval items: MATH's test split has 5,000), where templated siblings make many partial hits;
  - `match` on long documents (~600 words each: the synthetic pretraining stories, glued) against the 600 problems;
  - the whole ingest of math_sft (6,000 rows: read, validate, de-duplicate, write) with and without the check.
No reference library: no decontamination tool is installed here. Prints one JSON line.

    .venv/bin/python bench/decontam.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from align.data.decontam import DecontamConfig, load_references  # noqa: E402
from align.data.ingest_parquet import SourceConfig, ingest_source, iter_records  # noqa: E402
from align.data.schema import Conversation, Message  # noqa: E402
from align.data.synthetic_corpus import documents  # noqa: E402

SFT = SourceConfig(path="data/raw/math_sft.parquet", kind="sft", format="messages", id_column="id",
                   group_column="level")
RL = SourceConfig(path="data/raw/math_rl.parquet", kind="prompts", format="prompt_answer", id_column="id")


def _rate(refs, records, repeat: int) -> tuple[float, int]:
    """(records per second, best of `repeat`, and the matches found)."""
    best, matched = 0.0, 0
    for _ in range(repeat):
        start = time.perf_counter()
        matched = sum(refs.match(r) is not None for r in records)
        best = max(best, len(records) / (time.perf_counter() - start))
    return best, matched


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        ingest_source("math_sft", SFT, tmp / "sft", ROOT)
        short = list(iter_records(tmp / "sft" / "records.parquet", "sft"))
        stories = documents("stories", 3000)
        long = [Conversation(f"doc-{i}", (Message("user", " ".join(stories[30 * i:30 * (i + 1)])),))
                for i in range(100)]
        start = time.perf_counter()
        refs = load_references(DecontamConfig(), {}, ROOT)
        index_s = time.perf_counter() - start
        big = load_references(DecontamConfig(heldout=("rl",)), {"rl": RL}, ROOT)
        short_rate, short_hits = _rate(refs, short, args.repeat)
        big_rate, big_hits = _rate(big, short, args.repeat)
        long_rate, long_hits = _rate(refs, long, args.repeat)
        ingest = {}
        for label, screen in (("plain", None), ("checked", refs.screen("math_sft", SFT.location))):
            start = time.perf_counter()
            ingest_source("math_sft", SFT, tmp / label, ROOT, screen=screen)
            ingest[label] = len(short) / (time.perf_counter() - start)
    words_long = sum(len(r.messages[0].content.split()) for r in long) / len(long)
    print(json.dumps({
        "n": refs.cfg.n, "threshold": refs.cfg.threshold, "reference_items": len(refs.labels),
        "reference_grams": len(refs.index), "index_build_s": round(index_s, 3),
        "short_records": len(short), "short_records_per_s": round(short_rate), "short_matched": short_hits,
        "big_reference_items": len(big.labels), "big_reference_records_per_s": round(big_rate),
        "big_reference_matched": big_hits,
        "long_records": len(long), "long_words_mean": round(words_long), "long_records_per_s": round(long_rate),
        "long_matched": long_hits,
        "ingest_rows_per_s_plain": round(ingest["plain"]), "ingest_rows_per_s_checked": round(ingest["checked"]),
    }))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
