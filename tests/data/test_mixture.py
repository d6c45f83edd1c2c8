"""Mixture splits: realised shares within 1% of the targets over an epoch, world-size invariant, exactly resumable,
bound to their weights; one source builds exactly the shards it built before mixtures existed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from align.data.loader import BatchLoader, LoaderConfig
from align.data.mixture import MixtureConfig, RowMixture
from align.data.order import epoch_order
from align.data.shard_build import ShardBuildConfig, build_mixture_shards, build_shards
from align.data.store import ShardSet
from align.exceptions import ArtifactError, ConfigError
from align.exit_codes import run_with_exit_codes
from align.stages import shards as stage
from align.stages.pair_data import RowSubset
from align.tokenizer import TokenizerConfig
from data_records import ingest_rows, pair_rows, sft_rows
from loader_helpers import global_stream, roundtrip, take

SIZES = {"alpha": 40, "beta": 700, "gamma": 90}  # rows of each source
WEIGHTS = {"alpha": 0.3, "beta": 0.5, "gamma": 0.2}
EPOCH = 1000  # rows per epoch: alpha cycled 7.5 times, beta 500 of its 700 rows, gamma 2.2 times
BUILD = ShardBuildConfig(workers=1)


@pytest.fixture(scope="module")
def parts(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("mixture")
    src = {"kind": "sft", "format": "prompt_response"}
    out = {}
    for i, (name, n) in enumerate(SIZES.items()):  # distinct texts per source: no row is a duplicate of another's
        rows = [{**r, "prompt": f"[{name}] {r['prompt']}"} for r in sft_rows(n)]
        out[name] = ingest_rows(tmp, name, rows, src, 16 + 8 * i)
    out["pairs"] = ingest_rows(tmp, "pairs", pair_rows(12), {"kind": "pairs", "format": "pair_columns"}, 16)
    out["tmp"] = tmp
    return out


def _build(parts, name: str, weights: dict, **kw) -> ShardSet:
    mixture = MixtureConfig(sources=weights, **{"max_repetition": 10.0, "epoch_rows": EPOCH, **kw})
    build_mixture_shards({n: parts[n] for n in weights}, mixture, parts["tmp"] / name, TokenizerConfig(), BUILD)
    return ShardSet.open(parts["tmp"] / name)


@pytest.fixture(scope="module")
def mixed(parts) -> ShardSet:
    return _build(parts, "mixed", WEIGHTS)


def _source_of(shards: ShardSet) -> np.ndarray:
    out = np.empty(len(shards), dtype=np.int64)
    for s, rows in enumerate(shards.mixture.members):
        out[rows] = s
    return out


def _rows(step) -> list[int]:
    return [i for mb in step.micro_batches for i in mb["row_index"].tolist()]


def test_realised_shares_of_an_epoch_are_within_one_percent_of_the_targets(mixed):
    loader = BatchLoader(mixed, LoaderConfig(micro_batch_size=16, num_epochs=1), seed=5)
    rows = np.array([r for step in loader for r in _rows(step)])
    assert len(rows) == sum(len(p) for p in mixed.mixture.epoch_rows_of(5, 0)) >= EPOCH
    counts = np.bincount(_source_of(mixed)[rows], minlength=3)
    entry = {e["name"]: e for e in mixed.manifest["mixture"]["sources"]}
    for s, name in enumerate(mixed.mixture.names):
        share = counts[s] / len(rows)
        assert abs(share - WEIGHTS[name]) < 0.01, (name, share)
        assert entry[name]["realised_share"] == pytest.approx(share)  # the manifest says what the loader does
        assert entry[name]["rows"] == SIZES[name]
    alpha = rows[_source_of(mixed)[rows] == 0]  # the cycled source: every row used 7 or 8 times
    assert set(np.bincount(alpha, minlength=SIZES["alpha"]).tolist()) == {7, 8}
    beta = rows[_source_of(mixed)[rows] == 1]  # the under-sampled one: no repeat within the epoch
    assert len(set(beta.tolist())) == len(beta) == 500
    gamma = rows[_source_of(mixed)[rows] == 2]
    assert set(np.bincount(gamma - SIZES["alpha"] - SIZES["beta"]).tolist()) == {2, 3}


def test_a_down_sampled_source_rotates_through_its_rows_across_epochs(mixed):
    first, second = (set(mixed.mixture.epoch_rows_of(5, e)[1].tolist()) for e in (0, 1))
    assert first != second and len(first) == len(second) == 500


@pytest.mark.parametrize("world,accum", [(2, 1), (4, 2), (3, 1)])
def test_the_mixture_stream_does_not_depend_on_the_world_size(mixed, world, accum):
    one = LoaderConfig(micro_batch_size=8, grad_accum=world * accum)
    many = LoaderConfig(micro_batch_size=8, grad_accum=accum)
    def record(rank, mb):
        return mb["row_index"].tolist()

    assert global_stream(mixed, many, world, 9, record) == global_stream(mixed, one, 1, 9, record)


def test_resume_at_several_offsets_continues_the_identical_stream(mixed):
    cfg = LoaderConfig(micro_batch_size=32, grad_accum=2)
    full = [_rows(s) for s in take(BatchLoader(mixed, cfg, 3, rank=1, world_size=2), 20)]  # over an epoch's end
    for k in (1, 7, 15, 16, 19):
        loader = BatchLoader(mixed, cfg, 3, rank=1, world_size=2)
        take(loader, k)
        resumed = BatchLoader(mixed, cfg, 3, rank=1, world_size=2)
        resumed.load_state_dict(roundtrip(loader.state_dict()))
        assert [_rows(s) for s in take(resumed, len(full) - k)] == full[k:]


def test_resume_refuses_other_weights_over_the_same_shards(parts, mixed):
    other = _build(parts, "reweighted", {"alpha": 0.2, "beta": 0.6, "gamma": 0.2})
    assert other.digest == mixed.digest  # the same rows in the same files: only the weights differ
    loader = BatchLoader(mixed, LoaderConfig(micro_batch_size=8), 3)
    take(loader, 2)
    with pytest.raises(ArtifactError, match=r"mixture was .* \(the sources' shares of an epoch would differ\)"):
        BatchLoader(other, LoaderConfig(micro_batch_size=8), 3).load_state_dict(loader.state_dict())


def test_one_source_builds_the_shards_a_plain_split_builds(parts):
    plain = parts["tmp"] / "plain"
    build_shards(parts["beta"], plain, TokenizerConfig(), BUILD)
    alone = _build(parts, "alone", {"beta": 1.0})
    plain_manifest = ShardSet.open(plain).manifest
    assert "mixture" not in plain_manifest and plain_manifest["source"] == "beta"
    assert plain_manifest["files"] == alone.manifest["files"]  # same bytes, file for file
    assert ShardSet.open(plain).mixture is None
    n = SIZES["beta"]
    loader = BatchLoader(ShardSet.open(plain), LoaderConfig(micro_batch_size=n, num_epochs=1), seed=9)
    assert _rows(next(iter(loader))) == epoch_order(n, 9, 0).tolist()  # the plain order, untouched
    assert "mixture" not in loader.state_dict()


def test_a_weight_beyond_max_repetition_is_refused_at_build_naming_the_source(parts):
    with pytest.raises(ConfigError, match=r"source 'alpha' has 40 rows.*passes > max_repetition = 3"):
        _build(parts, "greedy", WEIGHTS, max_repetition=3.0)
    assert not (parts["tmp"] / "greedy").exists()


def test_sources_of_different_kinds_are_refused(parts):
    with pytest.raises(ArtifactError, match="one record kind.*alpha: sft.*pairs: pairs"):
        _build(parts, "kinds", {"alpha": 1.0, "pairs": 1.0})


def test_a_row_subset_keeps_its_sources_and_stays_inside_the_subset(mixed):
    keep = np.arange(0, len(mixed), 3)
    subset = RowSubset(mixed, keep)
    mix = subset.mixture
    assert isinstance(mix, RowMixture) and sum(len(m) for m in mix.members) == len(keep)
    assert all(np.all(_source_of(mixed)[keep[m]] == s) for s, m in enumerate(mix.members))
    rows = [r for step in BatchLoader(subset, LoaderConfig(micro_batch_size=16, num_epochs=1), 1) for r in _rows(step)]
    assert max(rows) < len(keep)
    counts = np.bincount(np.concatenate([np.full(len(m), s) for s, m in enumerate(mix.members)])[rows])
    assert np.allclose(counts / counts.sum(), [WEIGHTS[n] for n in mix.names], atol=0.01)


def test_mixture_config_is_checked():
    with pytest.raises(ValueError, match="at least one source"):
        MixtureConfig(sources={})
    with pytest.raises(ValueError, match="'a': weight must be > 0"):
        MixtureConfig(sources={"a": 0.0})


def test_the_shards_worker_builds_a_mixture_split_and_reports_its_shares(parts, tmp_path, monkeypatch):
    """`[mixtures.<split>]` of shards.toml through the worker: the split's metrics (its receipt) hold the shares."""
    runs = tmp_path / "runs"
    for name in ("alpha", "gamma"):  # where the worker looks for an ingest source's records
        shutil.copytree(parts[name], runs / "ingest" / name / "out")
    (tmp_path / "shards.toml").write_text(
        '[splits]\nplain = "alpha"\n\n[mixtures.mix]\nsources = { alpha = 1.0, gamma = 3.0 }\nmax_repetition = 2.0\n'
        '\n[build]\nworkers = 1\n')
    monkeypatch.setenv("ALIGN_RUNS_DIR", str(runs))
    monkeypatch.setenv("ALIGN_RUN_DIR", str(tmp_path / "run"))
    monkeypatch.setattr("sys.argv", ["shards", "--config", str(tmp_path / "shards.toml"), "split=mix"])
    assert run_with_exit_codes(stage.main) == 0
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    shares = {e["name"]: (e["target_share"], e["realised_share"], e["epoch_rows"])
              for e in metrics["mixture"]["sources"]}
    assert shares == {"alpha": (0.25, 33 / 131, 33), "gamma": (0.75, 98 / 131, 98)}  # 130 rows: ceil(32.5), ceil(97.5)
    assert metrics["rows"] == 130 and ShardSet.open(tmp_path / "run" / "out").mixture.names == ("alpha", "gamma")
    (tmp_path / "shards.toml").write_text(
        '[splits]\nmix = "alpha"\n\n[mixtures.mix]\nsources = { alpha = 1.0 }\n')
    assert run_with_exit_codes(stage.main) != 0  # a split in both tables is refused
