"""Step labels from the bundled task by rule (align.reward.step_labels) and PPO's per-token process rewards from a PRM
(align.rl.ppo.process_rewards): the rule's ratings on the task's right and wrong worked solutions, the step ends the
PPO scorer finds in a completion are exactly where rm_process puts the PRM's labels, and the rewards are the PRM's
centred beliefs there and 0 elsewhere."""

from __future__ import annotations

import random

import torch

from align.data.mathtask import draw_problem, render_solution, wrong_solution
from align.data.schema import Message, PreferencePair
from align.model import MistralConfig
from align.model.mistral import MistralForProcessReward
from align.rl.ppo.process_rewards import newline_token_ids, process_reward_scorer, step_ends
from align.reward.step_labels import label_solution, rate_step, step_records
from align.tokenizer import Tokenizer
from align.tokenizer.chat import encode_prompt
from align.reward.rm_process import PrmLossConfig, encode_steps

PROMPT = (Message("user", "Ann has 12 apples and gets 7 more. How many?"),)


def test_the_rule_rates_each_line_of_right_and_wrong_solutions():
    assert rate_step("12 + 7 = 19.", "19") == 1
    assert rate_step("12 + 7 = 20.", "20") == -1  # false arithmetic, whatever the gold
    assert rate_step("The answer is \\boxed{19}.", "19") == 1
    assert rate_step("The answer is \\boxed{20}.", "19") == -1
    assert rate_step("Let us add.", "19") == 0
    rng = random.Random(3)
    seen = set()
    for _ in range(60):
        problem = draw_problem(rng, rng.choice((2, 3, 4)))
        gold = str(problem.answer)
        right = label_solution("r", PROMPT, render_solution(problem.steps), gold)
        assert all(r == 1 for r in right.ratings) and len(right.steps) == len(problem.steps) + 1
        for kind in ("slip", "wrong_op", "final_copy"):
            text = wrong_solution(rng, problem, kind)
            if text is None:
                continue
            wrong = label_solution("w", PROMPT, text, gold)
            assert wrong.ratings[-1] == -1, (kind, text)  # the wrong box
            if kind == "slip":  # the slipped step is false as written (the ones after it build on it, true)
                assert wrong.ratings[:-1].count(-1) == 1, text
            else:  # wrong_op / final_copy: every step's arithmetic is true, only the box is caught
                assert all(r == 1 for r in wrong.ratings[:-1]), (kind, text)
            seen.add(kind)
    assert seen == {"slip", "wrong_op", "final_copy"}


def test_step_records_from_pairs_take_the_gold_from_the_chosen_box():
    pair = PreferencePair("p1", PROMPT, "12 + 7 = 19.\nThe answer is \\boxed{19}.",
                          "12 + 7 = 18.\nThe answer is \\boxed{18}.", group="g")
    chosen, rejected = step_records([pair])
    assert (chosen.id, chosen.ratings, chosen.gold, chosen.group) == ("p1/chosen", (1, 1), "19", "g")
    assert (rejected.id, rejected.ratings) == ("p1/rejected", (-1, -1))


def test_step_ends_are_where_the_prm_was_trained_to_score():
    tok = Tokenizer.from_pretrained()
    newline = newline_token_ids(tok)
    rng = random.Random(5)
    for _ in range(20):
        problem = draw_problem(rng, rng.choice((1, 2, 3, 4)))
        record = label_solution("r", PROMPT, render_solution(problem.steps), str(problem.answer))
        enc = encode_steps(tok, record, PrmLossConfig())
        n_prompt = len(encode_prompt(tok, [{"role": "user", "content": PROMPT[0].content}]))
        completion = torch.tensor([enc.ids[n_prompt:]])  # the reply as the policy samples it, `</s>` included
        assert completion[0, -1] == tok.eos_id
        found = step_ends(completion, torch.ones_like(completion), newline, tok.eos_id)
        assert (torch.nonzero(found[0]).squeeze(1) + n_prompt).tolist() == enc.step_ends
        short = torch.ones_like(completion)
        short[0, -3:] = 0  # a cut completion: its last real text token ends its last (partial) step
        assert int(torch.nonzero(step_ends(completion, short, newline, tok.eos_id)[0])[-1]) == completion.shape[1] - 4


def test_process_rewards_are_the_prms_centred_beliefs_at_step_ends():
    tok = Tokenizer.from_pretrained()
    torch.manual_seed(0)
    prm = MistralForProcessReward(MistralConfig(vocab_size=32768, hidden_size=32, intermediate_size=64,
                                                num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                                                max_position_embeddings=256, pad_token_id=0))
    record = label_solution("r", PROMPT, "12 + 7 = 19.\n19 * 2 = 38.\nThe answer is \\boxed{38}.", "38")
    enc = encode_steps(tok, record, PrmLossConfig())
    n_prompt = len(encode_prompt(tok, [{"role": "user", "content": PROMPT[0].content}]))
    comp = enc.ids[n_prompt:]
    width = len(comp) + 2  # right padding beyond the completion
    batch = {"input_ids": torch.tensor([enc.ids + [0, 0]]), "completion_start": torch.tensor([n_prompt]),
             "completion_ids": torch.tensor([comp + [0, 0]]),
             "completion_mask": torch.tensor([[1.0] * len(comp) + [0.0, 0.0]])}
    rewards = process_reward_scorer(prm, newline_token_ids(tok), tok.eos_id, weight=0.5)(batch)
    assert rewards.shape == (1, width)
    with torch.no_grad():
        logits = prm(torch.tensor([enc.ids]))[0, :, 0]
    at = [e - n_prompt for e in enc.step_ends]
    assert len(at) == 3
    want = torch.zeros(width)
    want[at] = 0.5 * (2 * torch.sigmoid(logits[enc.step_ends]) - 1)
    torch.testing.assert_close(rewards[0], want, atol=1e-6, rtol=0)
