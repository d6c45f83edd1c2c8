"""align.eval.canary: greedy pass@1 (and pass@k) through the real sampler; the callback's cadence and halt."""

import math

import torch

from align.eval.canary import Canary, CanaryConfig, EvalTask, evaluate
from rl_fixtures import EOS, decode, make_client, parity_prompts, tiny_model


def task(judge):
    prompts = parity_prompts(8)
    return EvalTask(prompts.ids, prompts.gold, decode, judge, EOS)


def test_greedy_pass_at_1_counts_what_the_judge_accepts():
    model = tiny_model()
    client = make_client(model)
    first_even = lambda text, gold: int(text.split()[0]) % 2 == 0  # noqa: E731
    result = evaluate(client, task(first_even), range(8), max_new_tokens=3, pass_k=2, pass_n=4, seed=1)
    firsts = [int(model(torch.tensor([task(first_even).ids(r)]))[0, -1].argmax()) for r in range(8)]
    assert result["pass@1"] == sum(f % 2 == 0 for f in firsts) / 8  # greedy = the argmax of the next token
    assert result["n"] == 8 and 0.0 <= result["pass@2"] <= 1.0 and result["stop_rate"] == 0.0
    assert evaluate(client, task(lambda t, g: True), range(8), 3)["pass@1"] == 1.0


def test_canary_callback_runs_every_n_steps_and_can_halt():
    client = make_client(tiny_model())

    class T:
        step = 2

    canary = Canary(CanaryConfig(every=2, rows=4, halt_below=0.5), client, task(lambda t, g: False), 3)
    metrics = {}
    assert "canary pass@1 0.000" in canary.observe(T, metrics) and metrics["canary/pass@1"] == 0.0
    T.step = 3
    metrics = {}
    assert canary.observe(T, metrics) is None and math.isnan(metrics["canary/pass@1"])
