"""Regenerate the tiny pretraining corpus under data/corpus/ (align/data/synthetic_corpus.py).

    .venv/bin/python data/generate_corpus.py     # rewrite data/corpus/{stories,facts}.parquet (one `text` column)"""

from __future__ import annotations

import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from align.data.synthetic_corpus import documents  # noqa: E402

OUT = Path(__file__).resolve().parent / "corpus"
SIZES = {"stories": 3000, "facts": 1500}


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    for source, n in SIZES.items():
        table = pa.table({"text": documents(source, n)})
        pq.write_table(table, OUT / f"{source}.parquet", compression="zstd", compression_level=9,
                       write_statistics=False)
        print(f"{source}: {n} documents -> {OUT / f'{source}.parquet'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
