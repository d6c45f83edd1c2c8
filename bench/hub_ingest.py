"""Ingest over HTTP (align.data.hub) against the same file read from disk: rows/s, requests, bytes on the wire.

A loopback `http.server` (tests/data/loopback_http.py, in this process on its own threads) serves a GSM8K-layout
parquet file and its JSONL copy; each is ingested from the local path and from the URL (kind "prompts"). For the
URL parquet: the range requests pyarrow made (footer + the row groups' column chunks) and the one sequential pass
that hashes the content. No reference library: `datasets` / `fsspec` need aiohttp and a hub, neither here.
Prints one JSON line.

    .venv/bin/python bench/hub_ingest.py --rows 200000 [--drops 3]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from align.data.hub import HttpConfig  # noqa: E402
from align.data.ingest_parquet import SourceConfig, ingest_source  # noqa: E402
from tests.data.loopback_http import LoopbackServer  # noqa: E402


def _rows(n: int) -> list[dict]:
    return [{"question": f"Ann has {i} pens and buys {i % 17} more. How many pens does she have now?",
             "answer": f"{i}+{i % 17}=<<{i}+{i % 17}={i + i % 17}>>{i + i % 17}\n#### {i + i % 17}"}
            for i in range(n)]


def _timed(name: str, src: SourceConfig, out: Path) -> dict:
    start = time.perf_counter()
    manifest = ingest_source(name, src, out)
    wall = time.perf_counter() - start
    return {"wall_s": round(wall, 3), "rows_per_s": round(manifest["rows_out"] / wall), "rows": manifest["rows_out"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--drops", type=int, default=0, help="the first N answers of each file are cut in half")
    args = ap.parse_args()
    http = HttpConfig(backoff_s=0.0, chunk_bytes=1 << 20)
    with tempfile.TemporaryDirectory() as tmp, LoopbackServer() as server:
        tmp = Path(tmp)
        rows = _rows(args.rows)
        pq.write_table(pa.Table.from_pylist(rows), tmp / "train.parquet", row_group_size=20_000)
        (tmp / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        out = {"bench": "hub_ingest", "rows": args.rows, "drops": args.drops}
        for kind in ("parquet", "jsonl"):
            data = (tmp / f"train.{kind}").read_bytes()
            url = server.serve(f"/train.{kind}", data, drops=args.drops)
            local = _timed("g", SourceConfig(path=str(tmp / f"train.{kind}"), kind="prompts", format="gsm8k"),
                           tmp / f"local-{kind}")
            remote = _timed("g", SourceConfig(url=url, kind="prompts", format="gsm8k", http=http), tmp / f"url-{kind}")
            ranges = [r for r in server.ranges_of(f"/train.{kind}") if r is not None]
            out[kind] = {"file_mb": round(len(data) / 2**20, 2), "local": local, "url": remote,
                         "requests": len(server.ranges_of(f"/train.{kind}")), "range_requests": len(ranges)}
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
