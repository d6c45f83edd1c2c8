"""Regenerate the bundled math task under data/raw/ (byte-identical for the same seed and pyarrow version).

    .venv/bin/python data/generate.py            # rewrite data/raw/*.parquet and data/raw/GENERATED.json
    .venv/bin/python data/generate.py --check    # regenerate in memory; exit 1 if any committed file differs

What each file holds: data/README.md. The task itself: align/data/mathtask.py, the splits: align/data/bundle.py."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from align.data.bundle import BundleConfig, generated_record, write_bundle  # noqa: E402

RAW = Path(__file__).resolve().parent / "raw"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=RAW)
    ap.add_argument("--check", action="store_true", help="compare with the files in --out instead of writing")
    args = ap.parse_args()
    if not args.check:
        record = write_bundle(args.out, BundleConfig())
        print(f"wrote {len(record['files'])} files to {args.out}")
        return 0
    import json
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        fresh = write_bundle(Path(tmp), BundleConfig())
    committed = json.loads((args.out / "GENERATED.json").read_text())
    current = generated_record(args.out)
    bad = [name for name in fresh["files"] if fresh["files"][name] != current["files"].get(name)]
    if fresh["pyarrow"] != committed["pyarrow"]:
        print(f"note: pyarrow {fresh['pyarrow']} here, files were written with {committed['pyarrow']}")
    for name in bad:
        print(f"differs: {args.out / name}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
