"""Reference-policy log-prob cache for DPO: one row per preference pair, computed once, keyed by its inputs.

A cache directory (an artifact, published atomically, `manifest.json` last) holds `ref_logps.safetensors` with four
(N,) tensors indexed by `pair_index`: `chosen_logps`, `rejected_logps` (fp32 summed completion log-probs under the
reference policy) and `chosen_tokens`, `rejected_tokens` (int32 completion lengths). Its manifest records the key.

The key is the sha256 of what determines those numbers: the reference checkpoint's content hash, the preference
shard set's manifest digest, the tokenizer's content hash, and the precision of the reference forward (dtype,
fp32 matmul precision), plus the format version. A reader states the key it expects; a cache made from anything
else is refused with the component that differs, never silently recomputed or half-used. A truncated or edited
file, a missing manifest, a wrong row count, or a non-finite value are refused with the file named."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from align.exceptions import ArtifactError
from align.utils.fsio import publish_dir, sha256_bytes, staging_dir
from align.utils.manifest import read_manifest, write_manifest

KIND = "ref_cache"
FILE = "ref_logps.safetensors"
FORMAT_VERSION = 1
LOGP_KEYS = ("chosen_logps", "rejected_logps")
TOKEN_KEYS = ("chosen_tokens", "rejected_tokens")


@dataclass(frozen=True)
class RefCacheKey:
    """Everything that determines the cached numbers. `digest()` is the cache's identity."""

    reference: str  # content hash of the reference (SFT) checkpoint
    shards: str  # manifest digest of the preference shard set
    tokenizer: str  # content hash of the tokenizer
    dtype: str  # dtype of the reference forward, e.g. "float32"
    matmul_precision: str = "highest"  # torch.get_float32_matmul_precision() during the forward
    format: int = FORMAT_VERSION

    def digest(self) -> str:
        return sha256_bytes(json.dumps(dataclasses.asdict(self), sort_keys=True).encode())

    def differences(self, other: "RefCacheKey") -> list[str]:
        """Human-readable `field: this != other` for every field that differs."""
        mine, theirs = dataclasses.asdict(self), dataclasses.asdict(other)
        return [f"{k}: cache has {mine[k]!r}, expected {theirs[k]!r}" for k in mine if mine[k] != theirs[k]]


@dataclass(frozen=True)
class RefLogps:
    """Reference log-probs of a batch of pairs, (B,) each."""

    chosen: torch.Tensor
    rejected: torch.Tensor


class RefCache:
    """A validated, fully loaded cache. Open with `RefCache.open`; look rows up by `pair_index`."""

    def __init__(self, path: Path, key: RefCacheKey, tensors: dict[str, torch.Tensor]):
        self.path, self.key, self._t = path, key, tensors

    def __len__(self) -> int:
        return int(self._t["chosen_logps"].shape[0])

    @classmethod
    def open(cls, path: str | Path, expected_key: RefCacheKey, expected_rows: int) -> "RefCache":
        path = Path(path)
        manifest = read_manifest(path, kind=KIND, verify_hashes=True)
        found = RefCacheKey(**manifest["key"]) if isinstance(manifest.get("key"), dict) else None
        if found is None or manifest.get("cache_key") != found.digest():
            raise ArtifactError(f"{path}/manifest.json: missing or inconsistent cache key")
        if found != expected_key:
            raise ArtifactError(f"{path}: reference cache key mismatch ({'; '.join(found.differences(expected_key))})"
                                "; rebuild it with the ref_cache stage")
        tensors = _load_tensors(path / FILE)
        _check_tensors(path / FILE, tensors, expected_rows)
        return cls(path, found, tensors)

    def lookup(self, pair_index: torch.Tensor) -> RefLogps:
        """pair_index (B,) int64 -> reference summed log-probs (B,) fp32 for the chosen and rejected arms."""
        idx = pair_index.long()
        if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= len(self)):
            raise ArtifactError(f"{self.path}: pair_index outside [0, {len(self)}): "
                                f"min {int(idx.min())}, max {int(idx.max())}")
        return RefLogps(self._t["chosen_logps"][idx], self._t["rejected_logps"][idx])

    def tokens(self, pair_index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        idx = pair_index.long()
        return self._t["chosen_tokens"][idx], self._t["rejected_tokens"][idx]

    def all_rows(self) -> dict[str, torch.Tensor]:
        return dict(self._t)


def _load_tensors(file: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(file))
    except (SafetensorError, OSError, RuntimeError) as exc:
        raise ArtifactError(f"{file}: unreadable reference cache ({exc})") from exc


def _check_tensors(file: Path, tensors: dict[str, torch.Tensor], rows: int) -> None:
    expected = set(LOGP_KEYS + TOKEN_KEYS)
    if set(tensors) != expected:
        raise ArtifactError(f"{file}: tensors {sorted(tensors)}, expected {sorted(expected)}")
    for name, t in tensors.items():
        if t.dim() != 1 or t.shape[0] != rows:
            raise ArtifactError(f"{file}: {name} has shape {tuple(t.shape)}, expected ({rows},): the cache was "
                                f"built for {t.shape[0] if t.dim() else 0} pairs, the shard set has {rows}")
    for name in LOGP_KEYS:
        bad = (~torch.isfinite(tensors[name])).nonzero()
        if bad.numel():
            raise ArtifactError(f"{file}: {name} row {int(bad[0])} is not finite")
    for name in TOKEN_KEYS:
        bad = (tensors[name] < 1).nonzero()
        if bad.numel():
            raise ArtifactError(f"{file}: {name} row {int(bad[0])} has no completion tokens")


def cached_preference_accuracy(cache: RefCache, rows: torch.Tensor | None = None) -> float:
    """Preference accuracy of the reference policy (fraction of pairs with log pi_ref(y_c) > log pi_ref(y_r)) on
    `rows` (all when None), from the cache alone: the SFT checkpoint's baseline without loading it."""
    rows = torch.arange(len(cache)) if rows is None else rows
    ref = cache.lookup(rows)
    return float((ref.chosen > ref.rejected).float().mean())


def probe_cache(path: str | Path, key: RefCacheKey, rows: int) -> RefCache | None:
    """The cache at `path` if it is complete and matches `key` and `rows`; None if absent or stale (for the builder's
    hit/miss decision only: a trainer calls `RefCache.open`, which raises instead)."""
    try:
        return RefCache.open(path, key, rows)
    except ArtifactError:
        return None


Scorer = Callable[[dict], tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]


def build_ref_cache(path: str | Path, key: RefCacheKey, rows: int, batches: Iterable[dict], score: Scorer,
                    extra: dict | None = None) -> RefCache:
    """Score every pair once and publish the cache at `path` atomically.

    `score(batch) -> (chosen_logps, rejected_logps, chosen_tokens, rejected_tokens)`, (B,) each, for the batch's
    `pair_index`. Every row must be scored exactly once. Until the final rename nothing at `path` changes; a crash
    leaves only a `.partial-<pid>` directory, which is never read and is removed by the next build."""
    path = Path(path)
    out = {k: torch.full((rows,), float("nan")) for k in LOGP_KEYS}
    out.update({k: torch.zeros(rows, dtype=torch.int32) for k in TOKEN_KEYS})
    seen = torch.zeros(rows, dtype=torch.bool)
    for batch in batches:
        idx = batch["pair_index"].long()
        if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= rows):
            raise ArtifactError(f"{path}: batch pair_index outside [0, {rows})")
        if seen[idx].any() or idx.unique().numel() != idx.numel():
            raise ArtifactError(f"{path}: pair_index {int(idx[seen[idx]][0]) if seen[idx].any() else idx.tolist()} "
                                "scored twice; the loader must visit each pair once")
        seen[idx] = True
        for name, value in zip(LOGP_KEYS + TOKEN_KEYS, score(batch), strict=True):
            out[name][idx] = value.detach().to(out[name].dtype).cpu()
    if not bool(seen.all()):
        raise ArtifactError(f"{path}: {int((~seen).sum())} of {rows} pairs were never scored "
                            f"(first missing row {int((~seen).nonzero()[0])})")
    staging = staging_dir(path)
    _check_tensors(staging / FILE, out, rows)
    save_file(out, str(staging / FILE), metadata={"cache_key": key.digest()})
    write_manifest(staging, KIND, inputs={"reference": key.reference, "shards": key.shards,
                                          "tokenizer": key.tokenizer},
                   extra={"key": dataclasses.asdict(key), "cache_key": key.digest(), "rows": rows, **(extra or {})})
    publish_dir(staging, path)
    return RefCache.open(path, key, rows)


def ensure_ref_cache(path: str | Path, key: RefCacheKey, rows: int,
                     prepare: Callable[[], tuple[Iterable[dict], Scorer]], extra: dict | None = None
                     ) -> tuple[RefCache, bool]:
    """Reuse the cache at `path` when it is complete and has this key (returns it and True); otherwise call
    `prepare()` (which loads the reference model and the loader, so a hit loads neither), build, and return False."""
    cached = probe_cache(path, key, rows)
    if cached is not None:
        return cached, True
    batches, score = prepare()
    return build_ref_cache(path, key, rows, batches, score, extra), False


def length_sorted_rows(lengths, batch_pairs: int, max_tokens: int | None = None) -> list[list[int]]:
    """Every row index exactly once, longest first, cut into batches of at most `batch_pairs` rows and (when set)
    at most `max_tokens` = rows x longest row. Sorting by length keeps padding, hence wasted compute, small."""
    order = sorted(range(len(lengths)), key=lambda r: (-int(lengths[r]), r))
    batches: list[list[int]] = []
    for row in order:
        current = batches[-1] if batches else None
        # the first row of a batch is its longest (descending order), so the batch width is lengths[current[0]]
        fits = current is not None and len(current) < batch_pairs and (
            max_tokens is None or (len(current) + 1) * int(lengths[current[0]]) <= max_tokens)
        if fits:
            current.append(row)
        else:
            batches.append([row])
    return batches


def cache_key(reference_dir: str | Path, shards_digest: str, tokenizer_hash: str, dtype: str) -> RefCacheKey:
    """The key a builder writes and a reader expects, from the artifacts themselves (the same function on both
    sides, so the two cannot drift). The matmul precision is the process's current setting."""
    from align.model.checkpoint import checkpoint_content_hash

    return RefCacheKey(reference=checkpoint_content_hash(reference_dir), shards=shards_digest,
                       tokenizer=tokenizer_hash, dtype=dtype, matmul_precision=torch.get_float32_matmul_precision())
