"""BatchLoader: rank-disjoint and complete, world-size-independent order, exact resume at every offset."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from align.data.loader import BatchLoader, LoaderConfig
from align.data.order import epoch_order
from align.data.store import ShardSet
from align.exceptions import ArtifactError, ConfigError
from loader_helpers import global_stream
from loader_helpers import roundtrip as _roundtrip
from loader_helpers import take as _take


@pytest.fixture(scope="module")
def sft(shard_sets) -> ShardSet:
    return ShardSet.open(shard_sets["sft"])


@pytest.fixture(scope="module")
def pairs(shard_sets) -> ShardSet:
    return ShardSet.open(shard_sets["pairs"])


def _index(mb: dict) -> list[int]:
    key = next(k for k in ("row_index", "pair_index", "prompt_index") if k in mb)
    return mb[key].tolist()


def _global_stream(shards, cfg, world, steps) -> list[list[list[int]]]:
    """Per step, the micro-batches' row indices in global position order, gathered from every rank."""
    return global_stream(shards, cfg, world, steps, lambda rank, mb: _index(mb))


@pytest.mark.parametrize("world,accum", [(1, 1), (2, 1), (3, 2), (4, 1), (2, 3)])
def test_ranks_are_disjoint_and_cover_every_epoch(sft, world, accum):
    cfg = LoaderConfig(micro_batch_size=4, grad_accum=accum)
    n, per_epoch = len(sft), 16  # 61 rows in micro-batches of 4
    steps = -(-2 * per_epoch // (world * accum))  # two epochs
    stream = _global_stream(sft, cfg, world, steps)
    owned = [(i % world, mb) for step in stream for i, mb in enumerate(step)]  # (rank, rows) in global order
    epochs = []
    for e in range(2):
        by_rank = [[row for rank, mb in owned[e * per_epoch:(e + 1) * per_epoch] if rank == r for row in mb]
                   for r in range(world)]
        flat = [row for rows in by_rank for row in rows]
        assert sorted(flat) == list(range(n)), "an epoch is not covered exactly once"
        assert all(by_rank), "a rank got nothing"  # 16 micro-batches spread over at most 4 ranks
        epochs.append([row for _, mb in owned[e * per_epoch:(e + 1) * per_epoch] for row in mb])
    assert epochs[0] == epoch_order(n, 7, 0).tolist() and epochs[1] == epoch_order(n, 7, 1).tolist()
    assert epochs[0] != epochs[1]  # a fresh permutation per epoch


def test_the_global_stream_does_not_depend_on_the_world_size(sft):
    one = _global_stream(sft, LoaderConfig(micro_batch_size=4, grad_accum=4), 1, 6)
    four = _global_stream(sft, LoaderConfig(micro_batch_size=4, grad_accum=1), 4, 6)
    two = _global_stream(sft, LoaderConfig(micro_batch_size=4, grad_accum=2), 2, 6)
    assert one == four == two


def test_two_ranks_never_read_the_same_stream(sft):
    # the seed-000 bug: every rank received the whole stream
    r0, r1 = (_take(BatchLoader(sft, LoaderConfig(micro_batch_size=5), 0, rank=r, world_size=2), 6)
              for r in (0, 1))
    rows0 = {row for b in r0 for mb in b.micro_batches for row in _index(mb)}
    rows1 = {row for b in r1 for mb in b.micro_batches for row in _index(mb)}
    assert rows0 and rows1 and not rows0 & rows1


def test_rank_defaults_to_torchrun_and_contradictions_are_refused(sft, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    loader = BatchLoader(sft, LoaderConfig(), 0)
    assert (loader.rank, loader.world_size) == (1, 2)
    with pytest.raises(ConfigError, match="told rank 0 of 1, but the RANK/WORLD_SIZE says rank 1 of 2"):
        BatchLoader(sft, LoaderConfig(), 0, rank=0, world_size=1)
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    with pytest.raises(ConfigError, match="rank 2 outside"):
        BatchLoader(sft, LoaderConfig(), 0, rank=2, world_size=2)


def _same_batches(a, b) -> None:
    assert (a.step, a.epoch, a.global_rows, a.global_loss_tokens) == (b.step, b.epoch, b.global_rows,
                                                                       b.global_loss_tokens)
    assert len(a.micro_batches) == len(b.micro_batches)
    for x, y in zip(a.micro_batches, b.micro_batches):
        assert x.keys() == y.keys()
        for key in x:
            assert torch.equal(x[key], y[key]), key


@pytest.mark.parametrize("kind,cfg", [
    ("pairs", LoaderConfig(micro_batch_size=3, grad_accum=2)),
    ("sft", LoaderConfig(micro_batch_size=8, max_tokens=400, pad_to_multiple=8)),
])
def test_resume_at_every_offset_yields_the_identical_remaining_stream(shard_sets, kind, cfg):
    shards = ShardSet.open(shard_sets[kind])
    full = _take(BatchLoader(shards, cfg, 3, rank=1, world_size=2), 14)  # more than two epochs
    for k in range(len(full)):
        loader = BatchLoader(shards, cfg, 3, rank=1, world_size=2)
        _take(loader, k) if k else None
        resumed = BatchLoader(shards, cfg, 3, rank=1, world_size=2)
        resumed.load_state_dict(_roundtrip(loader.state_dict()))
        rest = _take(resumed, len(full) - k)
        for a, b in zip(full[k:], rest):
            _same_batches(a, b)


def test_resume_with_another_world_size_continues_the_same_global_order(sft):
    before = LoaderConfig(micro_batch_size=4, grad_accum=1)
    after = LoaderConfig(micro_batch_size=4, grad_accum=2)  # 2 ranks x 1 -> 1 rank x 2: same global batch
    uninterrupted = _global_stream(sft, before, 2, 10)
    loaders = [BatchLoader(sft, before, 7, rank=r, world_size=2) for r in (0, 1)]
    for loader in loaders:
        _take(loader, 4)
    resumed = BatchLoader(sft, after, 7, rank=0, world_size=1)
    resumed.load_state_dict(loaders[0].state_dict())
    for expected, got in zip(uninterrupted[4:], _take(resumed, 6)):
        assert [_index(mb) for mb in got.micro_batches] == expected


def test_resume_refuses_other_data_seed_or_batching(shard_sets, sft, pairs):
    loader = BatchLoader(sft, LoaderConfig(micro_batch_size=4), 7)
    _take(loader, 2)
    state = loader.state_dict()
    with pytest.raises(ArtifactError, match=r"dataset was .* \(the shard set differs\)"):
        BatchLoader(pairs, LoaderConfig(micro_batch_size=4), 7).load_state_dict(state)
    with pytest.raises(ArtifactError, match="seed was 7, now 8"):
        BatchLoader(sft, LoaderConfig(micro_batch_size=4), 8).load_state_dict(state)
    with pytest.raises(ArtifactError, match=r"batching was .* \(micro-batch boundaries would differ\)"):
        BatchLoader(sft, LoaderConfig(micro_batch_size=5), 7).load_state_dict(state)


def test_token_budget_batches_respect_the_budget_and_cover_the_epoch(sft):
    cfg = LoaderConfig(micro_batch_size=16, max_tokens=300, pad_to_multiple=4, num_epochs=1)
    batches = list(BatchLoader(sft, cfg, 1))
    seen = []
    for batch in batches:
        for mb in batch.micro_batches:
            rows, width = mb["input_ids"].shape
            assert rows * width <= 300 and rows <= 16 and width % 4 == 0
            seen += _index(mb)
    assert sorted(seen) == list(range(len(sft)))
    assert len({mb["input_ids"].shape[0] for b in batches for mb in b.micro_batches}) > 1  # really variable
    with pytest.raises(ConfigError, match="max_tokens = 20 is below row"):
        BatchLoader(sft, LoaderConfig(max_tokens=20), 1)


def test_token_budget_counts_both_arms_of_a_pair(pairs):
    cfg = LoaderConfig(micro_batch_size=64, max_tokens=400, num_epochs=1)
    for batch in BatchLoader(pairs, cfg, 2):
        for mb in batch.micro_batches:
            assert mb["chosen_input_ids"].numel() + mb["rejected_input_ids"].numel() <= 400


def test_num_epochs_stops_every_rank_after_the_same_number_of_steps(sft):
    cfg = LoaderConfig(micro_batch_size=4, num_epochs=1)
    counts = [len(list(BatchLoader(sft, cfg, 1, rank=r, world_size=3))) for r in range(3)]
    assert counts == [6, 6, 6]  # 61 rows -> 16 micro-batches -> ceil(16 / 3) steps, the last one wraps


def test_sft_batch_layout_and_global_loss_tokens(sft):
    loaders = [BatchLoader(sft, LoaderConfig(micro_batch_size=4, grad_accum=2), 5, rank=r, world_size=2)
               for r in (0, 1)]
    steps = [_take(loader, 1)[0] for loader in loaders]
    total = 0
    for step in steps:
        for mb in step.micro_batches:
            ids, labels, mask = mb["input_ids"], mb["labels"], mb["attention_mask"]
            assert ids.dtype == labels.dtype == torch.int64 and mask.dtype == torch.bool
            assert ids.shape == labels.shape == mask.shape
            assert (labels[~mask] == -100).all() and (ids[~mask] == 0).all()
            assert torch.equal(labels[labels != -100], ids[labels != -100])
            for b, row in enumerate(_index(mb)):
                seq, loss_mask = sft.sequence(row)
                assert ids[b, :len(seq)].tolist() == seq.tolist() and mask[b].sum() == len(seq)
                assert (labels[b, :len(seq)] != -100).tolist() == loss_mask.astype(bool).tolist()
            total += int((labels != -100).sum())
    assert steps[0].global_loss_tokens == steps[1].global_loss_tokens == total
    assert steps[0].global_rows == 16


def test_pair_and_prompt_batch_layouts(shard_sets, pairs):
    mb = _take(BatchLoader(pairs, LoaderConfig(micro_batch_size=4), 0), 1)[0].micro_batches[0]
    assert mb["chosen_input_ids"].shape == mb["rejected_input_ids"].shape  # one width for both arms
    for b, row in enumerate(mb["pair_index"].tolist()):
        for arm, prefix in enumerate(("chosen", "rejected")):
            seq, _ = pairs.sequence(row, arm)
            assert mb[f"{prefix}_input_ids"][b, :len(seq)].tolist() == seq.tolist()
            assert int(mb[f"{prefix}_attention_mask"][b].sum()) == len(seq)
    prompts = ShardSet.open(shard_sets["prompts"])
    mb = _take(BatchLoader(prompts, LoaderConfig(micro_batch_size=5), 0), 1)[0].micro_batches[0]
    assert len(mb["prompt_ids"]) == len(mb["gold"]) == mb["prompt_index"].shape[0] == 5
    for ids, gold, row in zip(mb["prompt_ids"], mb["gold"], mb["prompt_index"].tolist()):
        assert ids == prompts.sequence(row)[0].tolist() and gold == prompts.meta(row)["gold"]


def test_epoch_order_is_a_stable_function_of_seed_and_epoch():
    # golden values: the permutation is written out in numpy so a library upgrade cannot reorder a resumed run
    assert epoch_order(10, 0, 0).tolist() == EXPECTED_SEED0_EPOCH0
    assert epoch_order(10, 0, 1).tolist() != EXPECTED_SEED0_EPOCH0
    assert epoch_order(10, 1, 0).tolist() != EXPECTED_SEED0_EPOCH0
    assert epoch_order(10, 0, 0, shuffle=False).tolist() == list(range(10))
    big = epoch_order(100_000, 5, 2)
    assert np.array_equal(np.sort(big), np.arange(100_000))


EXPECTED_SEED0_EPOCH0 = [0, 9, 1, 6, 3, 5, 4, 2, 8, 7]


def test_an_initialised_process_group_is_authoritative(sft, tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        assert (BatchLoader(sft, LoaderConfig(), 0).world_size) == 1
        with pytest.raises(ConfigError, match="told rank 0 of 2, but the process group says rank 0 of 1"):
            BatchLoader(sft, LoaderConfig(), 0, rank=0, world_size=2)
    finally:
        dist.destroy_process_group()
