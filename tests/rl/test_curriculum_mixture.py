"""The RL prompt draw over a mixture split: a prompt shard set built from several sources (`[mixtures.<split>]`)
is drawn by its weights (align.data.mixture's rule, the SFT/DPO loader's), world-size invariant and exactly
resumable; a set without a mixture draws exactly the rows it drew before mixtures reached the curriculum."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from align.data.ingest_parquet import SourceConfig, ingest_source
from align.data.mixture import MixtureConfig, RowMixture
from align.data.shard_build import ShardBuildConfig, build_mixture_shards
from align.data.store import ShardSet
from align.eval.prompts import PromptSet
from align.exceptions import ArtifactError, ConfigError
from align.rl.curriculum import CurriculumConfig, PromptCurriculum
from align.tokenizer import TokenizerConfig

GROUPS = [str(1 + (i * 7) % 4) for i in range(23)]
# rows drawn (take(7) then take(30)) per rank, by the curriculum before it knew mixtures (seed 1234): the tiny and
# smoke GRPO/PPO anchors rest on this order
BEFORE = {
    ("shuffle", 1): [[22, 7, 17, 4, 2, 21, 6, 11, 16, 18, 20, 3, 5, 12, 13, 15, 8, 19, 14, 1, 10, 0, 9, 15, 12, 17, 18,
                      19, 14, 8, 2, 3, 11, 16, 21, 9, 0]],
    ("shuffle", 2): [[22, 17, 2, 6, 16, 20, 5, 13, 8, 14, 10, 9, 15, 17, 19, 8, 3, 16, 9, 22, 10, 20, 4, 1, 22, 21, 0,
                      13, 8, 12, 16, 19, 7, 2, 3, 15, 15],
                     [7, 4, 21, 11, 18, 3, 12, 15, 19, 1, 0, 12, 18, 14, 2, 11, 21, 0, 6, 13, 5, 7, 14, 11, 5, 6, 1, 9,
                      17, 10, 4, 18, 20, 11, 13, 17, 21]],
    ("by_group", 1): [[4, 16, 20, 12, 8, 0, 7, 11, 3, 15, 19, 22, 2, 6, 18, 14, 10, 17, 21, 5, 13, 1, 9, 15, 12, 17, 18,
                       19, 14, 8, 2, 3, 11, 16, 21, 9, 0]],
    ("by_group", 2): [[4, 20, 8, 7, 3, 19, 2, 18, 10, 21, 13, 9, 15, 17, 19, 8, 3, 16, 9, 22, 10, 20, 4, 1, 22, 21, 0,
                       13, 8, 12, 16, 19, 7, 2, 3, 15, 15],
                      [16, 12, 0, 11, 15, 22, 6, 14, 17, 5, 1, 12, 18, 14, 2, 11, 21, 0, 6, 13, 5, 7, 14, 11, 5, 6, 1,
                       9, 17, 10, 4, 18, 20, 11, 13, 17, 21]],
}
CONFIGS = {"shuffle": CurriculumConfig(), "by_group": CurriculumConfig(order="by_group", warm_epochs=1)}


@pytest.mark.parametrize("order, world_size", list(BEFORE))
def test_a_plain_prompt_set_draws_the_rows_it_drew_before(order, world_size):
    for rank in range(world_size):
        c = PromptCurriculum(GROUPS, CONFIGS[order], 1234, rank, world_size)
        assert c.take(7) + c.take(30) == BEFORE[(order, world_size)][rank]
    state = PromptCurriculum(GROUPS, CONFIGS[order], 1234).state_dict()
    assert "mixture" not in state  # a plain set's state is what it was: older checkpoints resume


def _mixture(sizes=(6, 17), weights=(3.0, 1.0), epoch_rows=40) -> RowMixture:
    return RowMixture.from_manifest({"sources": [{"name": n, "rows": r, "weight": w}
                                                 for n, r, w in zip(("a", "b"), sizes, weights)],
                                     "max_repetition": 10.0, "epoch_rows": epoch_rows})


def test_the_draw_follows_the_mixture_every_rank_together_the_same_stream():
    mixture = _mixture()
    one = PromptCurriculum(GROUPS, CurriculumConfig(), 7, mixture=mixture)
    epoch0 = one.take(len(mixture.order(7, 0)))
    assert epoch0 == mixture.order(7, 0).tolist()
    source = Counter("a" if row < 6 else "b" for row in epoch0)
    assert source == Counter({"a": len(mixture.epoch_rows_of(7, 0)[0]), "b": len(mixture.epoch_rows_of(7, 0)[1])})
    assert abs(source["a"] / len(epoch0) - 0.75) <= 1 / 40  # the 3:1 weights, not the 6:17 rows
    streams = [PromptCurriculum(GROUPS, CurriculumConfig(), 7, r, 3, mixture).take(30) for r in range(3)]
    whole = PromptCurriculum(GROUPS, CurriculumConfig(), 7, mixture=mixture)
    by_epoch = [mixture.order(7, e).tolist() for e in range(3)]
    for r in range(3):  # each rank's positions r, r + 3, ... of every epoch
        assert streams[r] == [row for order in by_epoch for row in order[r::3]][:30]
    assert sorted(sum((s[:13] for s in streams), [])) == sorted(whole.take(39))


def test_by_group_warm_epochs_order_the_mixture_draw_by_group():
    mixture = _mixture()
    c = PromptCurriculum(GROUPS, CurriculumConfig(order="by_group", warm_epochs=1), 3, mixture=mixture)
    rows = c.take(len(mixture.order(3, 0)))
    assert [GROUPS[r] for r in rows] == sorted(GROUPS[r] for r in rows)
    assert Counter(rows) == Counter(mixture.order(3, 0).tolist())


def test_resume_continues_the_mixture_draw_and_refuses_another_mixture():
    mixture = _mixture()
    a = PromptCurriculum(GROUPS, CurriculumConfig(skip_solved=True), 1, 0, 2, mixture)
    a.take(17)
    a.record(4, True)
    state = a.state_dict()
    want = a.take(50)
    b = PromptCurriculum(GROUPS, CurriculumConfig(skip_solved=True), 1, 0, 2, mixture)
    b.load_state_dict(state)
    assert b.take(50) == want
    with pytest.raises(ArtifactError, match="mixture"):
        PromptCurriculum(GROUPS, CurriculumConfig(skip_solved=True), 1, 0, 2,
                         _mixture(weights=(1.0, 1.0))).load_state_dict(state)
    with pytest.raises(ArtifactError, match="mixture"):
        PromptCurriculum(GROUPS, CurriculumConfig(skip_solved=True), 1, 0, 2).load_state_dict(state)
    plain = PromptCurriculum(GROUPS, CurriculumConfig(), 1).state_dict()
    with pytest.raises(ArtifactError, match="mixture"):
        PromptCurriculum(GROUPS, CurriculumConfig(), 1, mixture=mixture).load_state_dict(plain)


def test_a_mixture_that_does_not_fit_is_refused_up_front():
    with pytest.raises(ArtifactError, match="the mixture's sources hold 23 rows, the prompt set 10"):
        PromptCurriculum(GROUPS[:10], CurriculumConfig(), 1, mixture=_mixture())
    with pytest.raises(ConfigError, match="max_repetition"):
        PromptCurriculum(GROUPS, CurriculumConfig(), 1, mixture=_mixture(epoch_rows=1000))


def test_a_prompt_mixture_split_reaches_the_draw(tmp_path):
    """prompts shards built by build_mixture_shards -> PromptSet.from_shards -> the curriculum's epoch shares."""
    records = {}
    for name, n in (("easy", 8), ("hard", 30)):
        path = tmp_path / f"{name}.parquet"
        pq.write_table(pa.Table.from_pylist([{"prompt": f"[{name}] What is {i} + 2?", "answer": str(i + 2)}
                                             for i in range(n)]), path)
        records[name] = tmp_path / name
        ingest_source(name, SourceConfig(kind="prompts", format="prompt_answer", path=str(path)), records[name])
    mixture = MixtureConfig(sources={"easy": 1.0, "hard": 1.0}, max_repetition=4.0, epoch_rows=20)
    build_mixture_shards(records, mixture, tmp_path / "shards", TokenizerConfig(), ShardBuildConfig(workers=1))
    shards = ShardSet.open(tmp_path / "shards")
    prompts = PromptSet.from_shards(shards)
    assert prompts.mixture is not None
    c = PromptCurriculum(prompts.groups, CurriculumConfig(), 11, mixture=prompts.mixture)
    rows = c.take(len(prompts.mixture.order(11, 0)))
    drawn = Counter(prompts.meta(r)["id"].split("-")[0] for r in rows)
    expected = {e["name"]: e["epoch_rows"] for e in shards.manifest["mixture"]["sources"]}
    assert drawn == expected and drawn["easy"] == drawn["hard"] == 10  # equal weights over 8 and 30 rows
    assert np.isin(rows, np.arange(8)).sum() == 10  # the easy source's rows come first in the set
