"""Token shards on disk: the fixed format, the writer of one shard, and `ShardSet`, the validated reader.

A shard set is a directory (an artifact: `manifest.json` of kind "token_shards", written last) holding, per shard:

    shard-00000.tokens.npy    (n_tokens,) uint16 or uint32: every sequence of the shard back to back
    shard-00000.masks.npy     (n_tokens,) uint8: the loss mask, 1 where the token is trained on
    shard-00000.offsets.npy   (n_seqs + 1,) int64: sequence j is tokens[offsets[j]:offsets[j+1]]
    shard-00000.rows.parquet  one row per record: id, group, content_hash, gold (prompts; null otherwise)

A row (one record) owns `seqs_per_row` consecutive sequences: 1 for sft and prompts, 2 for pairs (chosen first).
Arrays are opened as read-only memmaps; row metadata is read only when asked for, so opening a large set is cheap.
Opening validates the manifest (presence and size of every file, hashes on request), the array shapes against the
manifest's counts, and, when given, the tokenizer identity: a mismatch is refused with a clear error."""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from align.data.encoding import Encoded
from align.data.mixture import RowMixture
from align.exceptions import ArtifactError
from align.utils.fsio import disk_errors
from align.utils.manifest import manifest_digest, read_manifest

KIND = "token_shards"
FORMAT_VERSION = 1
ROW_SCHEMA = pa.schema([("id", pa.string()), ("group", pa.string()), ("content_hash", pa.string()),
                        ("gold", pa.string())])


def shard_name(index: int) -> str:
    return f"shard-{index:05d}"


def shard_files(name: str) -> dict[str, str]:
    return {part: f"{name}.{part}.npy" for part in ("tokens", "masks", "offsets")} | {"rows": f"{name}.rows.parquet"}


@dataclass(frozen=True)
class ShardStats:
    rows: int
    sequences: int
    tokens: int
    loss_tokens: int
    dropped_too_long: int
    truncated: int


def write_shard(directory: Path, name: str, encoded: list[Encoded], metas: list[dict], dtype: np.dtype,
                dropped: int = 0) -> ShardStats:
    """Write one shard's four files into `directory` (a staging directory; publication is the caller's)."""
    ids = [seq for row in encoded for seq in row.ids]
    masks = [m for row in encoded for m in row.masks]
    offsets = np.zeros(len(ids) + 1, dtype=np.int64)
    np.cumsum([len(s) for s in ids], out=offsets[1:])
    tokens = np.concatenate(ids) if ids else np.zeros(0, dtype=np.int64)
    if tokens.size and (tokens.min() < 0 or tokens.max() >= np.iinfo(dtype).max + 1):
        raise ValueError(f"{name}: token id outside the range of {dtype}")
    files = shard_files(name)
    arrays = {"tokens": tokens.astype(dtype), "offsets": offsets,
              "masks": np.concatenate(masks) if masks else np.zeros(0, dtype=np.uint8)}
    # A full disk: this shard's files are removed (its done marker was never written), then one DiskFullError.
    with disk_errors(directory / name, sum(a.nbytes for a in arrays.values())):
        try:
            for part in ("tokens", "masks", "offsets"):
                np.save(directory / files[part], arrays[part])
            pq.write_table(pa.Table.from_pylist(metas, schema=ROW_SCHEMA), directory / files["rows"],
                           compression="zstd", write_statistics=False)
        except BaseException:
            for file in files.values():
                (directory / file).unlink(missing_ok=True)
            raise
    loss_tokens = int(sum(int(m.sum()) for m in masks))
    return ShardStats(rows=len(encoded), sequences=len(ids), tokens=int(offsets[-1]), loss_tokens=loss_tokens,
                      dropped_too_long=dropped, truncated=sum(r.truncated for r in encoded))


@dataclass(frozen=True, eq=False)
class _Shard:
    tokens: np.ndarray
    masks: np.ndarray
    offsets: np.ndarray
    rows_file: Path


class ShardSet:
    """A validated, memory-mapped shard set. Rows are indexed 0..len-1 across shards, in build order."""

    def __init__(self, path: Path, manifest: dict, shards: list[_Shard]):
        self.path = path
        self.manifest = manifest
        self.kind: str = manifest["record_kind"]
        self.seqs_per_row: int = manifest["seqs_per_row"]
        self._shards = shards
        self._row_starts = np.cumsum([0] + [s["rows"] for s in manifest["shards"]]).tolist()

    @classmethod
    def open(cls, path: str | Path, *, kind: str | None = None, tokenizer_hash: str | None = None,
             verify_hashes: bool = True) -> ShardSet:
        """Open and validate. `kind` ("sft" | "pairs" | "prompts") and `tokenizer_hash` refuse a mismatch. Every
        file's sha256 is checked against the manifest (through the stat cache: an unchanged file is not rehashed)."""
        path = Path(path)
        manifest = read_manifest(path, kind=KIND, verify_hashes=verify_hashes)
        if manifest.get("format_version") != FORMAT_VERSION:
            raise ArtifactError(f"{path}: shard format version {manifest.get('format_version')!r}, this code reads "
                                f"{FORMAT_VERSION}; rebuild the shards")
        if kind is not None and manifest["record_kind"] != kind:
            raise ArtifactError(f"{path}: holds {manifest['record_kind']!r} rows, expected {kind!r}")
        built_with = manifest["tokenizer"]["content_hash"]
        if tokenizer_hash is not None and built_with != tokenizer_hash:
            raise ArtifactError(f"{path}: built with tokenizer {built_with[:12]}, but the tokenizer in use is "
                                f"{tokenizer_hash[:12]}; rebuild the shards with this tokenizer")
        shards = [cls._open_shard(path, entry, manifest["seqs_per_row"]) for entry in manifest["shards"]]
        return cls(path, manifest, shards)

    @staticmethod
    def _open_shard(path: Path, entry: dict, seqs_per_row: int) -> _Shard:
        files = shard_files(entry["name"])
        try:
            arrays = {part: np.load(path / files[part], mmap_mode="r") for part in ("tokens", "masks", "offsets")}
        except (OSError, ValueError) as exc:
            raise ArtifactError(f"{path / entry['name']}: unreadable shard array ({exc})") from None
        tokens, masks, offsets = arrays["tokens"], arrays["masks"], arrays["offsets"]
        expected_seqs = entry["rows"] * seqs_per_row
        if offsets.shape != (expected_seqs + 1,) or tokens.shape != (entry["tokens"],) or masks.shape != tokens.shape:
            raise ArtifactError(f"{path / files['offsets']}: shapes tokens {tokens.shape}, masks {masks.shape}, "
                                f"offsets {offsets.shape} disagree with the manifest ({entry['rows']} rows, "
                                f"{entry['tokens']} tokens)")
        if offsets[0] != 0 or offsets[-1] != tokens.shape[0] or np.any(np.diff(offsets) < 0):
            raise ArtifactError(f"{path / files['offsets']}: offsets are not a monotone index into the tokens")
        return _Shard(tokens, masks, offsets, path / files["rows"])

    # ---- identity and sizes ------------------------------------------------------------------------------------

    def __len__(self) -> int:
        return self._row_starts[-1]

    @cached_property
    def digest(self) -> str:
        """Content identity (the manifest's file table): what a loader state or a cache is bound to."""
        return manifest_digest(self.path)

    @property
    def tokenizer_hash(self) -> str:
        return self.manifest["tokenizer"]["content_hash"]

    @cached_property
    def mixture(self) -> RowMixture | None:
        """The sources of a mixture split's rows and their weights (align.data.mixture); None for one source."""
        entry = self.manifest.get("mixture")
        return None if entry is None else RowMixture.from_manifest(entry)

    @cached_property
    def row_lengths(self) -> np.ndarray:
        """(rows,) int64: the longest sequence of each row (a pair's padded width), for token-budget batching."""
        parts = []
        for shard in self._shards:
            lengths = np.diff(np.asarray(shard.offsets))
            parts.append(lengths.reshape(-1, self.seqs_per_row).max(axis=1))
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    @cached_property
    def row_loss_tokens(self) -> np.ndarray:
        """(rows,) int64: loss-mask tokens of each row, all its sequences together."""
        parts = []
        for shard in self._shards:
            cumulative = np.concatenate([[0], np.cumsum(shard.masks, dtype=np.int64)])
            per_seq = cumulative[shard.offsets[1:]] - cumulative[shard.offsets[:-1]]
            parts.append(per_seq.reshape(-1, self.seqs_per_row).sum(axis=1))
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    # ---- access --------------------------------------------------------------------------------------------------

    def _locate(self, row: int) -> tuple[int, int]:
        """(shard index, row within the shard)."""
        if not 0 <= row < len(self):
            raise IndexError(f"{self.path}: row {row} outside [0, {len(self)})")
        s = bisect.bisect_right(self._row_starts, row) - 1
        return s, row - self._row_starts[s]

    def sequence(self, row: int, arm: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """(ids int64, loss mask uint8) of one sequence; for pairs arm 0 is chosen, arm 1 rejected."""
        if not 0 <= arm < self.seqs_per_row:
            raise IndexError(f"{self.path}: arm {arm} outside [0, {self.seqs_per_row})")
        s, local = self._locate(row)
        shard = self._shards[s]
        j = local * self.seqs_per_row + arm
        lo, hi = int(shard.offsets[j]), int(shard.offsets[j + 1])
        return np.asarray(shard.tokens[lo:hi], dtype=np.int64), np.asarray(shard.masks[lo:hi])

    @cached_property
    def _meta(self) -> list[pa.Table]:
        return [pq.read_table(shard.rows_file) for shard in self._shards]

    def meta(self, row: int) -> dict:
        """{id, group, content_hash, gold} of a row (gold is None except for prompts)."""
        s, local = self._locate(row)
        table = self._meta[s]
        return {name: table.column(name)[local].as_py() for name in ROW_SCHEMA.names}
