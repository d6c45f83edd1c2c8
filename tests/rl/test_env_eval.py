"""align.rl.env_eval: greedy episodes through an environment as the RL receipt's evaluation (accuracy, tool-call
rate, calls, parse rate), checked against the episode driver itself on a real tiny policy; and the calculator's
tool-call layout (`<tool_call>` JSON, align.rl.environment.call_expression)."""

from __future__ import annotations

import json
import math

import torch

from align.rl.env_eval import EnvReceiptEvals, EpisodeEval, env_receipt, evaluate_episodes, summarise
from align.rl.environment import CalculatorEnv, EnvStep, EpisodeStart, call_expression, run_episodes
from align.rl.report import ReceiptEvals
from align.eval.canary import EvalTask
from rl_fixtures import EOS, decode, make_client, parity_prompts, tiny_model


def tool_call(expr, name="calculator"):
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": {"expression": expr}}) + "\n</tool_call>"


def test_calculator_answers_the_templates_tool_call_layout():
    env = CalculatorEnv()
    env.reset("q", {"gold": "10063"})
    assert env.step(tool_call("347 * 29")) == EnvStep("<result>10063</result>\n")
    # arguments as JSON text (the Hugging Face layout allows both), and the last of several calls
    text = '<calc>1 + 1</calc> <tool_call>{"name": "calculator", "arguments": "{\\"expression\\": \\"6 * 7\\"}"}' \
           '</tool_call>'
    assert call_expression(text) == "6 * 7" and env.step(text).observation == "<result>42</result>\n"
    for bad in (tool_call("347 * 29", name="python"), "<tool_call>{not json}</tool_call>",
                '<tool_call>{"name": "calculator", "arguments": {"expr": "1"}}</tool_call>', tool_call("x + 1")):
        assert env.step(bad).observation == "<result>error</result>\n", bad
    assert (env.calls, env.failed) == (6, 4)
    assert call_expression("The answer is \\boxed{3}.") is None and env.step("no call") == EnvStep()
    env.reset("q", {"gold": "1"})
    assert (env.calls, env.failed) == (0, 0)


class AnswerFirstTurn:
    """A real (scripted) environment over the fixtures' id-text: the first segment gets an observation; the call
    "fails" when that segment's first token id is odd."""

    def __init__(self):
        self.calls = self.failed = 0

    def reset(self, prompt, meta):
        self.calls = self.failed = 0

    def step(self, text):
        if self.calls:
            return EnvStep()
        self.calls += 1
        self.failed += int(text.split()[0]) % 2 if text else 0
        return EnvStep("7 8 9")

    def reward(self, completion):
        return 0.0


def first_even(text, gold):
    return bool(text) and int(text.split()[0]) % 2 == 0


KWARGS = dict(encode=lambda text: [int(t) for t in text.split()], decode=decode, eos_id=EOS,
              newline_ids=tuple(range(3, 40)), max_tokens=20, max_turns=2, tool_turns=None)


def test_greedy_episodes_are_judged_as_the_driver_runs_them():
    """evaluate_episodes on a real tiny policy equals run_episodes at temperature 0 judged row by row."""
    client, prompts = make_client(tiny_model(5)), parity_prompts(12)
    spec = EpisodeEval(AnswerFirstTurn, KWARGS, first_even)
    rows = range(12)
    out = evaluate_episodes(client, prompts, rows, spec)
    envs = []
    starts = [EpisodeStart(tuple(prompts.ids(r)), "", {"gold": prompts.gold(r)}, seed=99) for r in rows]
    eps = run_episodes(client, starts, lambda: envs.append(AnswerFirstTurn()) or envs[-1], temperature=0.0,
                       **KWARGS)
    right = [int(first_even(decode(list(e.completion_ids)), "")) for e in eps]
    called = [float(e.turns > 0) for e in eps]
    assert out["right"] == right and out["n"] == 12
    assert math.isclose(out["pass@1"], sum(right) / 12)
    assert math.isclose(out["tool_call_rate"], sum(called) / 12) and out["tool_call_rate"] > 0
    calls, failed = sum(e.calls for e in envs), sum(e.failed for e in envs)
    assert math.isclose(out["mean_calls"], calls / 12)
    assert math.isclose(out["call_parse_rate"], (calls - failed) / calls)
    assert set(out["pass@1_by_group"]) == set(out["tool_call_rate_by_group"]) == {"1", "2", "3"}
    assert evaluate_episodes(client, prompts, rows, spec) == out  # greedy: the seed does not matter


def test_summary_of_a_hand_made_table():
    # columns: right, stopped, called, calls, failed
    table = torch.tensor([[1, 1, 1, 1, 0], [0, 1, 1, 2, 1], [0, 0, 0, 0, 0], [1, 1, 0, 0, 0]], dtype=torch.float64)
    out = summarise(table, [0, 1, 2, 3], ["2", "2", "3", "3"])
    assert out["pass@1"] == 0.5 and out["stop_rate"] == 0.75 and out["tool_call_rate"] == 0.5
    assert out["mean_calls"] == 0.75 and math.isclose(out["call_parse_rate"], 2 / 3)
    assert out["accuracy_with_call"] == 0.5 and out["accuracy_without_call"] == 0.5
    assert out["pass@1_by_group"] == {"2": 0.5, "3": 0.5} and out["tool_call_rate_by_group"] == {"2": 1.0, "3": 0.0}
    assert out["mean_calls_by_group"] == {"2": 1.5, "3": 0.0} and out["call_parse_rate_by_group"]["2"] == 2 / 3
    assert math.isnan(out["call_parse_rate_by_group"]["3"])
    none = summarise(torch.zeros(2, 5, dtype=torch.float64), [0, 1], ["1", "1"])
    assert math.isnan(none["call_parse_rate"]) and math.isnan(none["accuracy_with_call"])


def test_receipt_block_before_after_and_the_rollout_curve(tmp_path):
    client, prompts = make_client(tiny_model(5)), parity_prompts(6)
    task = EvalTask(prompts.ids, prompts.gold, decode, first_even, EOS)
    base = ReceiptEvals(client, task, range(6), task, range(3), 16)
    evals = EnvReceiptEvals(base, client, prompts, prompts, EpisodeEval(AnswerFirstTurn, KWARGS, first_even))
    before, after = evals(), evals()
    assert set(before) == {"heldout", "trained"} and before["trained"]["n"] == 3 and evals.results == [before, after]
    history = tmp_path / "history.jsonl"
    history.write_text("".join(json.dumps({"step": s, "rollout/tool_call_rate": v}) + "\n"
                               for s, v in enumerate([0.2, 0.3, 0.8, 0.9], 1)))
    block = env_receipt(before, after, history)
    assert block["start_tool_call_rate"] == before["heldout"]["tool_call_rate"]
    assert block["trained_call_parse_rate"] == after["trained"]["call_parse_rate"]
    assert block["rollout_tool_call_rate_first"] == 0.2 and block["rollout_tool_call_rate_last"] == 0.9
    assert block["rollout_tool_call_rate_points"] == 4


def test_grpo_receipt_runs_the_environment_before_and_after(tmp_path, monkeypatch):
    """The real grpo_checkpoint worker with [environment]: metrics.json's accuracy comes from greedy episodes and its
    `environment` block holds the tool-call rate, calls and parse rate before and after (random tiny policy: the
    numbers are what the episodes give, checked for shape and range)."""
    import importlib
    import sys

    from align.exit_codes import run_with_exit_codes
    from stage_inputs import runs_tree

    runs, config = runs_tree(tmp_path, steps=1)
    config.write_text(config.read_text() + "\n[environment]\nname = \"calculator\"\nmax_turns = 2\nmax_tokens = 12\n")
    monkeypatch.setenv("ALIGN_RUNS_DIR", str(runs))
    monkeypatch.setenv("ALIGN_RUN_DIR", str(runs / "env"))
    monkeypatch.setattr(sys, "argv", ["align.stages.grpo", "--config", str(config), "data.train_eval_rows=3"])
    assert run_with_exit_codes(importlib.import_module("align.stages.grpo").main) == 0
    metrics = json.loads((runs / "env" / "metrics.json").read_text())
    block = metrics["environment"]
    for key in ("tool_call_rate", "start_tool_call_rate", "trained_tool_call_rate", "mean_calls"):
        assert 0.0 <= block[key] <= 2.0, key
    assert set(block["tool_call_rate_by_group"]) == set(metrics["accuracy_by_level"])
    assert block["rollout_tool_call_rate_points"] == 1 and metrics["trained_rows"] == 3
