"""align.rl.curriculum: seeded order, exact resume, group order, rank streams, pass-rate memory."""

import pytest

from align.exceptions import ArtifactError
from align.rl.curriculum import CurriculumConfig, PromptCurriculum

GROUPS = ["3", "1", "2", "1", "3", "2", "1", "2", "3", "1"]


def test_same_seed_same_order_and_every_row_once_per_epoch():
    a = PromptCurriculum(GROUPS, CurriculumConfig(), seed=5)
    b = PromptCurriculum(GROUPS, CurriculumConfig(), seed=5)
    first = a.take(10)
    assert first == b.take(10) and sorted(first) == list(range(10))
    assert a.take(10) != first  # the next epoch is another permutation
    assert PromptCurriculum(GROUPS, CurriculumConfig(), seed=6).take(10) != first


def test_resume_continues_exactly_mid_epoch():
    a = PromptCurriculum(GROUPS, CurriculumConfig(skip_solved=True), seed=1)
    a.take(7)
    a.record(3, True)
    state = a.state_dict()
    want = a.take(25)
    b = PromptCurriculum(GROUPS, CurriculumConfig(skip_solved=True), seed=1)
    b.load_state_dict(state)
    assert b.take(25) == want


def test_resume_refuses_other_rows_or_seed():
    state = PromptCurriculum(GROUPS, CurriculumConfig(), seed=1).state_dict()
    with pytest.raises(ArtifactError, match="seed"):
        PromptCurriculum(GROUPS, CurriculumConfig(), seed=2).load_state_dict(state)
    with pytest.raises(ArtifactError, match="rows"):
        PromptCurriculum(GROUPS[:5], CurriculumConfig(), seed=1).load_state_dict(state)


def test_by_group_visits_easy_groups_first_then_shuffles():
    c = PromptCurriculum(GROUPS, CurriculumConfig(order="by_group", warm_epochs=1), seed=0)
    levels = [GROUPS[r] for r in c.take(10)]
    assert levels == sorted(levels)
    later = [GROUPS[r] for r in c.take(10)]
    assert later != sorted(later)


def test_rank_streams_are_disjoint_and_cover_the_epoch():
    r0 = PromptCurriculum(GROUPS, CurriculumConfig(), seed=3, rank=0, world_size=2).take(5)
    r1 = PromptCurriculum(GROUPS, CurriculumConfig(), seed=3, rank=1, world_size=2).take(5)
    assert sorted(r0 + r1) == list(range(10))


def test_solved_prompts_are_skipped_for_an_epoch():
    c = PromptCurriculum(GROUPS, CurriculumConfig(skip_solved=True), seed=0)
    first = c.take(10)
    c.record(first[0], True)
    assert first[0] not in c.take(9)  # epoch 1 skips it: 9 rows left
    assert first[0] in c.take(10)  # epoch 2 uses it again
    for row in range(10):
        c.record(row, True)
    assert len(c.take(3)) == 3  # everything solved: the memory is cleared instead of looping
