"""Step credit (align.rl.step_credit): each `a op b = c` result's tokens get the group-relative advantage of that
fact's truth; the batch source attaches it, the GRPO loss adds it to the row's advantage, and a row with step credit
but outcome advantage 0 still trains."""

import math

import pytest
import torch

from align.rl.advantages import AdvantageConfig
from align.rl.grpo_module import token_advantages
from align.rl.grpo_loss import GrpoLossConfig
from align.rl.stage_config import RolloutShape
from align.rl.step_credit import StepCreditConfig, group_step_advantages, result_tokens, results, token_spans
from align.rl.zero_rows import row_rule, zero_gradient_rows
from align.eval.verifier import RewardResult
from align.tokenizer import Tokenizer
from align.train.train_module import AccumInfo
from rl_fixtures import make_client, make_module, make_source, tiny_model

SOLUTIONS = (" 88 - 4 = 84.\n84 - 7 = 77.\n77 + 9 = 86.\nThe answer is \\boxed{86}.",
             " 88 - 4 = 83.\n83 - 7 = 76.\n76 + 9 = 85.\nThe answer is \\boxed{85}.",
             " 88 - 4 = 84.\n84 - 7 = 76.\n76 + 9 = 85.\nThe answer is \\boxed{85}.")


@pytest.fixture(scope="module")
def mistral():
    tok = Tokenizer.from_pretrained()
    return tok, (lambda ids: tok.decode(ids, skip_special_tokens=True))


def test_results_read_each_equation_its_truth_and_result_characters():
    found = results(SOLUTIONS[1])
    assert [(r.fact, r.true) for r in found] == [(("88", "-", "4"), False), (("83", "-", "7"), True),
                                                 (("76", "+", "9"), True)]
    assert [SOLUTIONS[1][r.start:r.end] for r in found] == ["83", "76", "85"]
    assert results("6 / 0 = 0 and 2 x 3 = 6")[0].true is False and results("2 x 3 = 6")[0].true


def test_token_spans_tile_the_decoded_text_with_the_mistral_tokenizer(mistral):
    tok, decode = mistral
    for text in SOLUTIONS:
        ids = tok.encode(text)
        spans = token_spans(ids, decode)
        assert spans[0][0] == 0 and spans[-1][1] == len(decode(ids))
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
        for r in results(decode(ids)):  # the digits of every result, token by token
            assert "".join(decode([ids[k]]) for k in result_tokens(spans, r)).strip() == text[r.start:r.end]


def test_token_spans_refuse_prefixes_that_are_not_prefixes():
    pieces = {1: "ab", 2: "c"}
    decode = lambda ids: "X" if ids == [1] else "".join(pieces[i] for i in ids)  # noqa: E731
    assert token_spans([1, 2], decode) is None


def test_group_advantages_by_hand(mistral):
    tok, decode = mistral
    ids = [tok.encode(t) for t in SOLUTIONS]
    cfg = StepCreditConfig(weight=2.0, negative_scale=0.5)
    adv = group_step_advantages(ids, decode, cfg)
    # 88 - 4: true, false, true (mu 2/3, sigma sqrt(2)/3); 84 - 7: true (sample 0), false (sample 2), mu 1/2, sigma
    # 1/2; 83 - 7, 77 + 9, 76 + 9 (twice, both true): no spread, no credit
    up = 2.0 * (1 - 2 / 3) / (math.sqrt(2) / 3 + 1e-4)
    down = 0.5 * 2.0 * (0 - 2 / 3) / (math.sqrt(2) / 3 + 1e-4)
    half = 2.0 * 0.5 / (0.5 + 1e-4)
    by_text = [{decode(ids[i][:k + 1]): a for k, a in enumerate(adv[i]) if a} for i in range(3)]
    assert list(by_text[0].values()) == pytest.approx([up, up, half, half])
    assert list(by_text[1].values()) == pytest.approx([down, down])
    assert list(by_text[2].values()) == pytest.approx([up, up, -0.5 * half, -0.5 * half])
    assert [t.split("\n")[-1] for t in by_text[2]][-2:] == ["84 - 7 = 7", "84 - 7 = 76"]  # the result's digits
    off = group_step_advantages(ids, decode, StepCreditConfig(weight=2.0, negative_scale=0.0))
    assert min(min(a) for a in off) == 0.0 and max(max(a) for a in off) == pytest.approx(half)


def test_config_refuses_bad_values():
    for bad in (dict(weight=-1.0), dict(negative_scale=1.5), dict(eps=-1.0)):
        with pytest.raises(ValueError):
            StepCreditConfig(**bad)


# ---------------------------------------------------------------------------------------------- through GRPO
def equation_decode(ids: list[int]) -> str:
    """Every token id writes one step of the same fact, true when the id is even: `1 + 1 = 2` or `1 + 1 = 3`."""
    return "".join(f"1 + 1 = {2 + i % 2}. " for i in ids)


def first_step_true(text: str, gold: str) -> RewardResult:
    """1 when the completion's first step holds (so groups have mixed outcomes too)."""
    found = results(text)
    ok = bool(found) and found[0].true
    return RewardResult(float(ok), True, text, "correct" if ok else "wrong")


SHAPE = RolloutShape(prompts=4, samples=4, max_new_tokens=6, num_minibatches=1, micro_batch_size=8,
                     truncated="keep")


def source(module, client, weight: float, rule=None):
    return iter(make_source(module, client, shape=SHAPE, advantage=AdvantageConfig(negative_scale=0.0),
                            decode=equation_decode, verifier=first_step_true, step_credit=StepCreditConfig(weight),
                            skip_rows=rule))


def test_the_batch_source_attaches_step_credit_on_true_results_only():
    model = tiny_model()
    client = make_client(model)
    window = next(source(make_module(model, client), client, 1.0))
    for mb in window:
        step, ids, mask = mb["step_advantages"], mb["completion_ids"], mb["completion_mask"]
        assert step.shape == ids.shape
        assert bool((step[(ids % 2 == 1) | (mask == 0)] == 0).all())  # false results (odd ids), padding: none
        assert bool((step[(ids % 2 == 0) & (mask == 1)] > 0).any())
        adv = token_advantages(mb)
        assert torch.equal(adv, mb["advantages"][:, None] + step)


def test_a_row_with_step_credit_is_not_a_zero_gradient_row():
    batch = {"completion_ids": torch.zeros(3, 2, dtype=torch.long), "loss_mask": torch.tensor([[1., 1.], [1., 0.],
                                                                                                [1., 1.]]),
             "advantages": torch.zeros(3), "step_advantages": torch.tensor([[0., 0.5], [0., 0.7], [0., 0.]])}
    assert zero_gradient_rows(batch, GrpoLossConfig()).tolist() == [False, True, True]  # row 1's credit is masked


def test_skipping_zero_rows_keeps_the_gradient_with_step_credit():
    grads = []
    for rule in (None, row_rule(GrpoLossConfig(), (0.0, 0.0))):
        model = tiny_model()
        client = make_client(model)
        module = make_module(model, client)
        window = next(source(module, client, 1.0, rule))
        units = sum(module.loss_units(mb) for mb in window)
        for i, mb in enumerate(window):
            module.train_batch(mb, AccumInfo(i, len(window), units, 1))
        grads.append({n: p.grad.clone() for n, p in module.model.named_parameters()})
    for name, g in grads[0].items():
        assert float((grads[1][name] - g).abs().max()) <= 1e-6 * float(g.abs().max()), name


def test_step_credit_moves_the_gradient():
    def grad(weight):
        model = tiny_model()
        client = make_client(model)
        module = make_module(model, client)
        window = next(source(module, client, weight))
        units = sum(module.loss_units(mb) for mb in window)
        for i, mb in enumerate(window):
            module.train_batch(mb, AccumInfo(i, len(window), units, 1))
        return torch.cat([p.grad.reshape(-1) for p in module.model.parameters()])

    base, credited = grad(0.0), grad(1.0)  # weight 0: no step_advantages at all, the outcome's gradient
    assert float((credited - base).abs().max()) > 1e-3 * float(base.abs().max())
