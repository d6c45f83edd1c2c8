"""Regenerate the bundled math task under data/raw/ (byte-identical for the same seed and pyarrow version).

    .venv/bin/python data/generate.py            # rewrite data/raw/*.parquet and data/raw/GENERATED.json
    .venv/bin/python data/generate.py --check    # regenerate in memory; exit 1 if any committed file differs

What each file holds: data/README.md. The task itself: align/data/mathtask.py, the splits: align/data/bundle.py.
The calculator task (calc_*.parquet, the calc_tiny profile's data): align/data/calctask.py, recorded under
GENERATED.json's `calc` key (its config and hashes) beside the bundle's."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from align.config import to_dict  # noqa: E402
from align.data.bundle import BundleConfig, generated_record, write_bundle  # noqa: E402
from align.data.calctask import CalcConfig, write_calc  # noqa: E402
from align.utils.fsio import atomic_write_json, sha256_file  # noqa: E402

RAW = Path(__file__).resolve().parent / "raw"


def write_all(out: Path) -> dict:
    """The bundle (its GENERATED.json), then the calculator task's files, recorded under the `calc` key."""
    record = write_bundle(out, BundleConfig())
    record["calc"] = {"config": to_dict(CalcConfig()), "files": write_calc(out, CalcConfig())}
    atomic_write_json(out / "GENERATED.json", record)
    return record


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=RAW)
    ap.add_argument("--check", action="store_true", help="compare with the files in --out instead of writing")
    args = ap.parse_args()
    if not args.check:
        record = write_all(args.out)
        print(f"wrote {len(record['files']) + len(record['calc']['files'])} files to {args.out}")
        return 0
    import json
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        fresh = write_all(Path(tmp))
    committed = json.loads((args.out / "GENERATED.json").read_text())
    current = {**generated_record(args.out)["files"],
               **{name: sha256_file(args.out / name) for name in fresh["calc"]["files"] if (args.out / name).is_file()}}
    expected = {**fresh["files"], **fresh["calc"]["files"]}
    bad = [name for name in expected if expected[name] != current.get(name)]
    if fresh["pyarrow"] != committed["pyarrow"]:
        print(f"note: pyarrow {fresh['pyarrow']} here, files were written with {committed['pyarrow']}")
    for name in bad:
        print(f"differs: {args.out / name}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
