"""Sequence packing: bins (greedy / first-fit decreasing), the packed batch layout, coverage and rank disjointness,
exact resume at every offset, and the refusals (a conversation longer than seq_len, pairs, max_tokens)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from align.data.loader import BatchLoader, LoaderConfig
from align.data.packing import pack, pack_ffd, pack_greedy
from align.data.store import ShardSet
from align.exceptions import ArtifactError, ConfigError
from align.train.sft_loss import shift_labels
from loader_helpers import global_stream
from loader_helpers import roundtrip as _roundtrip
from loader_helpers import take as _take

IGNORE = -100


@pytest.fixture(scope="module")
def sft(shard_sets) -> ShardSet:
    return ShardSet.open(shard_sets["sft"])


def _bins(positions, starts):
    return [positions[lo:hi].tolist() for lo, hi in zip(starts[:-1], starts[1:])]


def _naive_first_fit(sizes, seq_len):
    rooms, out = [], []
    for size in sizes:
        k = next((i for i, room in enumerate(rooms) if room >= size), len(rooms))
        rooms.append(seq_len) if k == len(rooms) else None
        rooms[k] -= size
        out.append(k)
    return out


@pytest.mark.parametrize("seq_len", [40, 64, 257])
def test_bins_hold_every_document_once_and_fit(seq_len):
    lengths = np.random.default_rng(seq_len).integers(1, 41, size=300)
    greedy, ffd = pack_greedy(lengths, seq_len), pack_ffd(lengths, seq_len, seed=3, epoch=0)
    for positions, starts in (greedy, ffd):
        assert sorted(positions.tolist()) == list(range(300))
        assert all(sum(lengths[b]) <= seq_len for b in _bins(positions, starts))
        assert all(_bins(positions, starts))  # no empty bin
    assert greedy[0].tolist() == list(range(300))  # next-fit keeps the stream order
    assert len(ffd[1]) <= len(greedy[1])  # ffd never needs more rows here
    lower_bound = -(-int(lengths.sum()) // seq_len)
    assert len(ffd[1]) - 1 <= 11 * lower_bound // 9 + 1  # FFD's bound: 11/9 OPT + 6/9


def test_ffd_is_first_fit_decreasing_and_a_function_of_seed_and_epoch():
    lengths = np.random.default_rng(0).integers(1, 100, size=500)
    positions, starts = pack_ffd(lengths, 128, seed=1, epoch=0)
    order = sorted(range(500), key=lambda i: (-lengths[i], i))
    expected = _naive_first_fit([int(lengths[i]) for i in order], 128)
    groups = {}
    for i, k in zip(order, expected):
        groups.setdefault(k, []).append(i)
    assert sorted(sorted(g) for g in groups.values()) == sorted(_bins(positions, starts))
    for b in _bins(positions, starts):
        assert b == sorted(b)  # documents of a row in stream order
    same = pack(lengths, 128, "ffd", 1, 0)
    assert all(np.array_equal(x, y) for x, y in zip(same, (positions, starts)))
    assert not np.array_equal(pack(lengths, 128, "ffd", 1, 1)[0], positions)  # the bin order changes per epoch
    assert not np.array_equal(pack(lengths, 128, "ffd", 2, 0)[0], positions)


@pytest.mark.parametrize("packing", ["greedy", "ffd"])
def test_packed_rows_layout_labels_and_boundaries(sft, packing):
    cfg = LoaderConfig(micro_batch_size=3, packing=packing, seq_len=128, num_epochs=1, pad_id=0)
    seen, real = [], 0
    for step in BatchLoader(sft, cfg, 4):
        for mb in step.micro_batches:
            ids, labels, mask = mb["input_ids"], mb["labels"], mb["attention_mask"]
            pos, doc = mb["position_ids"], mb["document_ids"]
            assert ids.shape == labels.shape == mask.shape == pos.shape == doc.shape and ids.shape[1] == 128
            rows, i = mb["row_index"].tolist(), 0
            for b in range(ids.shape[0]):
                t = 0
                for d in range(int(doc[b].max()) + 1):
                    seq, loss_mask = sft.sequence(rows[i])
                    n, span = len(seq), slice(t, t + len(seq))
                    assert ids[b, span].tolist() == seq.tolist() and (doc[b, span] == d).all()
                    assert pos[b, span].tolist() == list(range(n)) and mask[b, span].all()
                    want = np.where(loss_mask.astype(bool), seq, IGNORE)
                    want[0] = IGNORE  # never a target: the token before it is another document's
                    assert labels[b, span].tolist() == want.tolist()
                    t, i = t + n, i + 1
                assert not mask[b, t:].any() and (labels[b, t:] == IGNORE).all() and (doc[b, t:] == -1).all()
            assert i == len(rows)
            targets = shift_labels(labels)  # what position t is trained to predict
            crossing = (doc[:, :-1] != doc[:, 1:])
            assert (targets[:, :-1][crossing] == IGNORE).all()  # no loss across a document boundary
            seen += rows
            real += int(mask.sum())
    assert sorted(seen) == list(range(len(sft)))
    assert real == sft.manifest["tokens"]


def _index_stream(shards, cfg, world, steps):
    """Per step, (rank, row indices) of every micro-batch in global position order."""
    return global_stream(shards, cfg, world, steps, lambda rank, mb: (rank, mb["row_index"].tolist()))


@pytest.mark.parametrize("world,accum", [(1, 1), (2, 1), (3, 2), (2, 3)])
def test_packed_ranks_are_disjoint_and_cover_every_epoch(sft, world, accum):
    cfg = LoaderConfig(micro_batch_size=2, grad_accum=accum, packing="ffd", seq_len=128)
    loader = BatchLoader(sft, cfg, 7)
    per_epoch = [loader.micro_batches_in_epoch(e) for e in (0, 1)]
    steps = -(-sum(per_epoch) // (world * accum))
    owned = [mb for step in _index_stream(sft, cfg, world, steps) for mb in step]
    for lo, hi in ((0, per_epoch[0]), (per_epoch[0], sum(per_epoch))):
        by_rank = [[row for rank, rows in owned[lo:hi] if rank == r for row in rows] for r in range(world)]
        assert sorted(row for rows in by_rank for row in rows) == list(range(len(sft)))
        assert all(by_rank)
        for r in range(world):
            for other in range(r + 1, world):
                assert not set(by_rank[r]) & set(by_rank[other])
    strip = [[rows for _, rows in step] for step in _index_stream(sft, cfg, world, steps)]
    alone = LoaderConfig(micro_batch_size=2, grad_accum=accum * world, packing="ffd", seq_len=128)
    assert strip == [[rows for _, rows in step] for step in _index_stream(sft, alone, 1, steps)]


@pytest.mark.parametrize("packing", ["greedy", "ffd"])
def test_packed_resume_at_every_offset_yields_the_identical_remaining_stream(sft, packing):
    cfg = LoaderConfig(micro_batch_size=2, grad_accum=2, packing=packing, seq_len=96)
    full = _take(BatchLoader(sft, cfg, 3, rank=1, world_size=2), 12)  # more than two epochs
    assert len({b.epoch for b in full}) >= 3
    for k in range(len(full)):
        loader = BatchLoader(sft, cfg, 3, rank=1, world_size=2)
        _take(loader, k) if k else None
        resumed = BatchLoader(sft, cfg, 3, rank=1, world_size=2)
        resumed.load_state_dict(_roundtrip(loader.state_dict()))
        for a, b in zip(full[k:], _take(resumed, len(full) - k)):
            assert (a.step, a.epoch, a.global_rows, a.global_loss_tokens) == (b.step, b.epoch, b.global_rows,
                                                                               b.global_loss_tokens)
            for x, y in zip(a.micro_batches, b.micro_batches, strict=True):
                assert x.keys() == y.keys() and all(torch.equal(x[key], y[key]) for key in x)


def test_resume_refuses_another_packing_and_unpacked_states_keep_their_shape(sft):
    loader = BatchLoader(sft, LoaderConfig(micro_batch_size=2, packing="ffd", seq_len=128), 7)
    _take(loader, 2)
    state = loader.state_dict()
    for other in (LoaderConfig(micro_batch_size=2, packing="greedy", seq_len=128),
                  LoaderConfig(micro_batch_size=2, packing="ffd", seq_len=160), LoaderConfig(micro_batch_size=2)):
        with pytest.raises(ArtifactError, match=r"batching was .* \(micro-batch boundaries would differ\)"):
            BatchLoader(sft, other, 7).load_state_dict(state)
    # a loader state written before packing existed (no packing / seq_len keys) still resumes an unpacked run
    assert LoaderConfig().batching() == {"micro_batch_size": 8, "shuffle": True, "pad_to_multiple": 1}


def test_a_conversation_longer_than_seq_len_is_refused(sft, shard_sets):
    longest = int(sft.row_lengths.max())
    n_over = int((sft.row_lengths > longest - 5).sum())
    with pytest.raises(ConfigError, match=rf"loader.seq_len = {longest - 5} is shorter than {n_over} "
                                          rf"conversation\(s\) .* row {int(sft.row_lengths.argmax())}, {longest} "
                                          rf"tokens\); packing never splits"):
        BatchLoader(sft, LoaderConfig(packing="greedy", seq_len=longest - 5), 0)
    BatchLoader(sft, LoaderConfig(packing="greedy", seq_len=longest), 0)  # exactly fitting is fine
    with pytest.raises(ConfigError, match="packs SFT conversations; .* holds 'pairs' rows"):
        BatchLoader(ShardSet.open(shard_sets["pairs"]), LoaderConfig(packing="ffd", seq_len=512), 0)
    with pytest.raises(ValueError, match="max_tokens and packing = 'ffd' exclude each other"):
        LoaderConfig(packing="ffd", max_tokens=512)


def test_epoch_stats_count_padding(sft):
    padded = BatchLoader(sft, LoaderConfig(micro_batch_size=8), 1).epoch_stats()
    greedy = BatchLoader(sft, LoaderConfig(micro_batch_size=2, packing="greedy", seq_len=128), 1).epoch_stats()
    ffd = BatchLoader(sft, LoaderConfig(micro_batch_size=2, packing="ffd", seq_len=128), 1).epoch_stats()
    assert padded["tokens"] == greedy["tokens"] == ffd["tokens"] == sft.manifest["tokens"]
    assert padded["batch_rows"] == len(sft) and ffd["documents"] == len(sft)
    assert ffd["padded_tokens"] == ffd["batch_rows"] * 128
    assert 0 <= ffd["padding_fraction"] <= greedy["padding_fraction"] < 1
    assert ffd["batch_rows"] <= 11 * -(-ffd["tokens"] // 128) // 9 + 1  # near the fewest rows that could hold it
    assert 0 < padded["padding_fraction"] < 1  # (on the bundled data packing wins: bench/sft_packing.py)
