"""align.train.ref_cache: a hit on the second run, a miss (rebuild) when any key input changes, and a refusal
naming the file or the differing input for a mismatched, truncated, edited, short or incomplete cache."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from align.exceptions import ArtifactError
from align.train.ref_cache import FILE, RefCache, RefCacheKey, build_ref_cache, ensure_ref_cache

ROWS = 10
KEY = RefCacheKey(reference="a" * 64, shards="b" * 64, tokenizer="c" * 64, dtype="float32")


def _batches(order=None, size=3):
    order = torch.randperm(ROWS, generator=torch.Generator().manual_seed(0)) if order is None else order
    return [{"pair_index": order[i:i + size]} for i in range(0, len(order), size)]


def _score(batch):
    i = batch["pair_index"].double()
    return -(i + 1.5), -(2 * i + 3.0), i.int() + 2, i.int() + 4


def _prepare(calls):
    def prepare():
        calls.append(1)
        return _batches(), _score
    return prepare


def test_build_then_lookup_by_pair_index(tmp_path):
    cache = build_ref_cache(tmp_path / "c", KEY, ROWS, _batches(), _score)
    ref = cache.lookup(torch.tensor([7, 0, 3]))
    assert ref.chosen.tolist() == [-8.5, -1.5, -4.5] and ref.rejected.tolist() == [-17.0, -3.0, -9.0]
    assert [t.tolist() for t in cache.tokens(torch.tensor([7]))] == [[9], [11]]
    with pytest.raises(ArtifactError, match=r"outside \[0, 10\)"):
        cache.lookup(torch.tensor([10]))


def test_hit_on_second_run_and_miss_on_each_changed_input(tmp_path):
    calls: list = []
    _, hit = ensure_ref_cache(tmp_path / "c", KEY, ROWS, _prepare(calls))
    assert not hit and len(calls) == 1
    _, hit = ensure_ref_cache(tmp_path / "c", KEY, ROWS, _prepare(calls))
    assert hit and len(calls) == 1
    for field in ("reference", "shards", "tokenizer", "dtype"):
        changed = dataclasses.replace(KEY, **{field: "x"})
        with pytest.raises(ArtifactError, match=f"key mismatch.*{field}: cache has"):
            RefCache.open(tmp_path / "c", changed, ROWS)
        _, hit = ensure_ref_cache(tmp_path / "c", changed, ROWS, _prepare(calls))
        assert not hit
        RefCache.open(tmp_path / "c", changed, ROWS)  # the rebuilt cache carries the new key
        ensure_ref_cache(tmp_path / "c", KEY, ROWS, _prepare(calls))
    assert len(calls) == 1 + 2 * 4


def test_wrong_row_count_refused(tmp_path):
    build_ref_cache(tmp_path / "c", KEY, ROWS, _batches(), _score)
    with pytest.raises(ArtifactError, match=r"built for 10 pairs, the shard set has 11"):
        RefCache.open(tmp_path / "c", KEY, ROWS + 1)


def test_truncated_or_edited_file_and_missing_manifest_refused(tmp_path):
    path = tmp_path / "c"
    build_ref_cache(path, KEY, ROWS, _batches(), _score)
    data = (path / FILE).read_bytes()
    (path / FILE).write_bytes(data[:-8])
    with pytest.raises(ArtifactError, match=f"{FILE}: .* bytes, manifest"):
        RefCache.open(path, KEY, ROWS)
    (path / FILE).write_bytes(data[:-8] + b"\x00" * 8)
    with pytest.raises(ArtifactError, match="sha256 differs"):
        RefCache.open(path, KEY, ROWS)
    (path / FILE).write_bytes(data)
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["key"]["dtype"] = "bfloat16"  # a hand-edited key no longer matches the recorded digest
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match="inconsistent cache key"):
        RefCache.open(path, KEY, ROWS)
    (path / "manifest.json").unlink()
    with pytest.raises(ArtifactError, match="no manifest.json"):
        RefCache.open(path, KEY, ROWS)


def test_interrupted_build_leaves_nothing_read_as_complete(tmp_path):
    path = tmp_path / "c"
    old = build_ref_cache(path, KEY, ROWS, _batches(), _score)
    new_key = dataclasses.replace(KEY, reference="d" * 64)

    def dying(batch):
        if int(batch["pair_index"][0]) == int(_batches()[2]["pair_index"][0]):
            raise KeyboardInterrupt  # the worker killed mid-build
        return _score(batch)

    with pytest.raises(KeyboardInterrupt):
        build_ref_cache(path, new_key, ROWS, _batches(), dying)
    assert RefCache.open(path, KEY, ROWS).lookup(torch.arange(ROWS)).chosen.equal(old.lookup(torch.arange(ROWS)).chosen)
    with pytest.raises(ArtifactError, match="key mismatch"):
        RefCache.open(path, new_key, ROWS)
    # a writer that died after staging files but before publication: the partial directory is never the cache
    fresh = tmp_path / "fresh"
    partial = tmp_path / "fresh.partial-999999"
    partial.mkdir()
    (partial / FILE).write_bytes(b"half")
    with pytest.raises(ArtifactError, match="no manifest.json"):
        RefCache.open(fresh, KEY, ROWS)
    build_ref_cache(fresh, KEY, ROWS, _batches(), _score)
    assert not partial.exists()


def test_unscored_duplicate_and_non_finite_rows_refused(tmp_path):
    with pytest.raises(ArtifactError, match="1 of 10 pairs were never scored"):
        build_ref_cache(tmp_path / "c", KEY, ROWS, _batches(torch.arange(ROWS - 1)), _score)
    with pytest.raises(ArtifactError, match="scored twice"):
        build_ref_cache(tmp_path / "c", KEY, ROWS, _batches(torch.tensor([0, 1, 2, 2, 3, 4, 5, 6, 7, 8, 9])), _score)

    def nan_score(batch):
        c, r, tc, tr = _score(batch)
        return c * float("nan"), r, tc, tr

    with pytest.raises(ArtifactError, match="chosen_logps row .* is not finite"):
        build_ref_cache(tmp_path / "c", KEY, ROWS, _batches(), nan_score)
    assert not (tmp_path / "c").exists()


def test_length_sorted_rows_cover_every_row_once_within_budgets():
    from align.train.ref_cache import length_sorted_rows

    lengths = [5, 9, 3, 9, 7, 1, 4]
    batches = length_sorted_rows(lengths, batch_pairs=3, max_tokens=20)
    assert sorted(r for b in batches for r in b) == list(range(7))
    assert batches[0] == [1, 3]  # 3 x 9 > 20
    for b in batches:
        assert len(b) <= 3 and len(b) * max(lengths[r] for r in b) <= 20
    assert length_sorted_rows(lengths, batch_pairs=4) == [[1, 3, 4, 0], [6, 2, 5]]
