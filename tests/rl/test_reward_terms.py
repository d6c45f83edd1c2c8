"""align.rl.reward_terms: `[reward] terms`, the registry, and the older keys' bit-identical translation."""

from __future__ import annotations

import itertools
import math
import struct
import textwrap
import tomllib
from pathlib import Path

import pytest
import torch

from align.config import from_dict, load_config, to_toml
from align.eval.verifier import score
from align.exceptions import ConfigError
from align.model.mistral import MistralForProcessReward, MistralForValueHead
from align.rl.grpo_module import rollout_metrics
from align.rl.ppo.process_rewards import process_sequence_scorer, step_ends
from align.rl.ppo.rewards import reward_model_scorer
from align.rl.ppo.stage_config import PpoRewardConfig, PpoStageConfig
from align.rl.report import reward_terms
from align.rl.reward_terms import REWARD_TERMS, RewardTermConfig, TermInput, legacy_terms
from align.rl.rewards import CompositeReward, RewardConfig, soft_overlong
from align.rl.stage_config import GrpoStageConfig
from align.utils.tracking import MetricsHistory
from align.verify.step_check import false_steps
from rl_fixtures import EOS, make_client, make_module, make_source, parity_verifier, tiny_model

ROOT = Path(__file__).resolve().parents[2]
TEXTS = (" 3 + 4 = 7.\nThe answer is \\boxed{7}.", " 3 + 4 = 8.\nThe answer is \\boxed{8}.", "The answer is 7.",
         " 6 * 4 = 30.\n30 + 7 = 31.\nThe answer is \\boxed{31}.", " 6 * 4 = 24.\n24 + 7 = 31.\n\\boxed{31}",
         "\\boxed{7} and \\boxed{8}", "\\boxed{}", "")
GOLDS = ("7", "31", "\\frac{")


def bits(x: float) -> bytes:
    return struct.pack("<d", x)


def old_total(cfg: RewardConfig, text: str, gold: str, n: int, finish: str, max_new: int):
    """The reward before the term registry (align/rl/rewards.py at 6c526ac), line for line: the reference the
    translation must equal bit for bit. None: an invalid sample."""
    if finish == "error":
        return None
    verdict = score(text, gold)
    truncated = finish == "length"
    overlong = soft_overlong(n, max_new, cfg.overlong_buffer, cfg.overlong_penalty)
    if verdict.reward is None:
        return None
    outcome = verdict.reward
    if cfg.step_check and outcome and false_steps(text):
        outcome = 0.0
    return (cfg.outcome_weight * outcome + cfg.format_weight * float(verdict.format_ok) - overlong
            - cfg.truncation_penalty * float(truncated))


def stage_rewards() -> list[tuple[str, RewardConfig]]:
    """The [reward] tables of every RL config in the repository."""
    out = []
    for path in sorted(ROOT.glob("configs/*/grpo.toml")) + sorted(ROOT.glob("configs/*/ppo.toml")):
        cls = GrpoStageConfig if path.name == "grpo.toml" else PpoStageConfig
        out.append((str(path.relative_to(ROOT)), load_config(path, cls).reward))
    return out


def as_terms_toml(cfg: RewardConfig) -> str:
    """The same reward written as a `terms` list, by hand-formatted TOML (what a user would write)."""
    return textwrap.dedent(f"""
        terms = [
          {{ name = "verifier", weight = {cfg.outcome_weight!r}, step_check = {str(cfg.step_check).lower()} }},
          {{ name = "format", weight = {cfg.format_weight!r}, layout = "boxed" }},
          {{ name = "length", buffer = {cfg.overlong_buffer}, penalty = {cfg.overlong_penalty!r} }},
          {{ name = "truncation", weight = {cfg.truncation_penalty!r} }},
        ]
        """)


WEIGHTS = [RewardConfig(), RewardConfig(step_check=True), RewardConfig(outcome_weight=0.7, format_weight=0.3),
           RewardConfig(format_weight=-0.25, overlong_buffer=5, overlong_penalty=0.9, truncation_penalty=0.35,
                        step_check=True),
           RewardConfig(outcome_weight=-1.0, format_weight=-0.5, truncation_penalty=0.1)]


@pytest.mark.parametrize("source,cfg", stage_rewards() + [(f"grid{i}", c) for i, c in enumerate(WEIGHTS)])
def test_the_older_keys_and_the_same_terms_give_the_old_reward_bit_for_bit(source, cfg):
    max_new = 16
    legacy = CompositeReward(cfg, max_new)
    listed = CompositeReward(from_dict(RewardConfig, tomllib.loads(as_terms_toml(cfg)), "<terms>", "reward"),
                             max_new)
    assert [t.cfg for t in listed.terms] == list(legacy_terms(cfg.outcome_weight, cfg.format_weight,
                                                              cfg.overlong_buffer, cfg.overlong_penalty,
                                                              cfg.truncation_penalty, cfg.step_check))
    for text, gold, n, finish in itertools.product(TEXTS, GOLDS, (3, 12, 16, 20), ("stop", "length", "error")):
        want = old_total(cfg, text, gold, n, finish, max_new)
        a, b = legacy(text, gold, n, finish), listed(text, gold, n, finish)
        assert a == b
        if want is None:
            assert not a.valid
        else:
            assert a.valid and bits(a.total) == bits(want), (source, text, gold, n, finish, a.total, want)


def test_existing_configs_resolve_without_a_terms_key():
    """`terms` absent is written by omission: the resolved configs (and their digests) are what they were."""
    for source, cfg in stage_rewards():
        assert cfg.terms is None and "terms" not in to_toml(cfg), source


def test_term_list_in_a_stage_config(tmp_path):
    path = tmp_path / "grpo.toml"
    path.write_text((ROOT / "configs/tiny/grpo.toml").read_text().replace(
        'include = "common.toml"', f'include = "{ROOT / "configs/tiny/common.toml"}"').replace(
        "[reward]\noutcome_weight = 1.0\nstep_check = true",
        '[reward]\nterms = [{ name = "verifier", step_check = true },'
        ' { name = "format", weight = 0.2, layout = "think" }]'))
    cfg = load_config(path, GrpoStageConfig)
    assert [t.name for t in cfg.reward.terms] == ["verifier", "format"] and cfg.reward.terms[1].weight == 0.2
    assert "layout = \"think\"" in to_toml(cfg)


@pytest.mark.parametrize("table,match", [
    ({"terms": [{"name": "nope"}]}, "unknown reward term 'nope'; registered: code_tests, format"),
    ({"terms": [{"name": "verifier", "buffer": 3}]}, "takes no option 'buffer'"),
    ({"terms": [{"name": "verifier"}], "step_check": True}, "with `terms`, step_check is a term's option"),
    ({"terms": [{"name": "verifier"}, {"name": "verifier"}]}, "label 'verifier' is used twice"),
    ({"terms": [{"name": "python", "function": "no_colon"}]}, "must be 'module:function'"),
    ({"terms": [{"name": "format", "layout": "xml"}]}, "layout must be one of boxed, think"),
    ({"terms": [{"name": "reward_model"}]}, "needs `path`"),
    ({"terms": [{"name": "code_tests", "mode": "most"}]}, "mode must be one of fraction, all"),
    ({"terms": []}, "terms is empty"),
])
def test_bad_term_lists_are_refused_naming_the_key(table, match):
    with pytest.raises(ConfigError, match=match):
        from_dict(RewardConfig, table, "grpo.toml", "reward")


def test_ppo_refuses_the_older_model_key_beside_terms():
    with pytest.raises(ConfigError, match="give the reward model as a `reward_model` term"):
        from_dict(PpoRewardConfig, {"terms": [{"name": "verifier"}], "model": "rm_checkpoint/final"}, "ppo.toml",
                  "reward")
    ok = from_dict(PpoRewardConfig, {"terms": [{"name": "reward_model", "path": "rm_checkpoint/final"}]})
    assert ok.terms[0].path == "rm_checkpoint/final"


def test_registry_names():
    assert REWARD_TERMS.names() == ["code_tests", "format", "length", "process_reward_model", "python",
                                    "reward_model", "truncation", "verifier"]


# ------------------------------------------------------------------------------------------------ text terms

def terms(*entries: dict, **kw) -> CompositeReward:
    return CompositeReward(from_dict(RewardConfig, {"terms": list(entries)}), kw.pop("max_new", 32), **kw)


def test_format_layouts():
    r = terms({"name": "format", "layout": "think"})
    assert r("<think>3 + 4 = 7</think> The answer is \\boxed{7}.", "7", 9, "stop").total == 1.0
    for bad in ("The answer is \\boxed{7}.", "<think>x</think> no box", "<think>a</think><think>b</think>\\boxed{7}",
                "\\boxed{7} <think>late</think>", "<think>\\boxed{7}</think>", "<think>x</think> \\boxed{7}\\boxed{8}"):
        assert r(bad, "7", 9, "stop").total == 0.0, bad
    p = terms({"name": "format", "pattern": r"\s*Answer: \d+\s*"})
    assert [p(t, "7", 3, "stop").total for t in (" Answer: 12 ", "Answer: x", "Well. Answer: 3")] == [1.0, 0.0, 0.0]


def test_length_truncation_and_weighted_sum():
    r = terms({"name": "verifier", "weight": 2.0}, {"name": "length", "buffer": 8, "penalty": 0.5},
              {"name": "truncation", "weight": 0.25, "label": "cut"}, max_new=20)
    s = r("\\boxed{7}", "7", 16, "length")
    assert s.terms == (("verifier", 1.0), ("length", -0.25), ("cut", -1.0))
    assert s.total == 2.0 - 0.25 - 0.25 and s.overlong == 0.25 and s.truncated and s.correct


def test_without_an_outcome_term_nothing_is_correct():
    r = terms({"name": "format"})
    s = r("\\boxed{7}", "8", 3, "stop")
    assert s.total == 1.0 and s.outcome == 0.0 and not s.correct and s.valid


USER_FNS = '''
import os, time

def good(prompt, completion, meta):
    return len(completion) / 10 + (1.0 if meta.get("group") == "3" else 0.0) + (0.5 if "Q:" in prompt else 0.0)

def boom(prompt, completion, meta):
    if completion.startswith("x"):
        raise ValueError("user bug")
    return 1.0

def slow(prompt, completion, meta):
    if completion == "hang":
        time.sleep(60)
    return 2.0

def nan(prompt, completion, meta):
    return float("nan")

def dies(prompt, completion, meta):
    if completion == "die":
        os._exit(9)
    return 3.0

not_callable = 4
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(USER_FNS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "my_rewards"


def test_python_term_calls_the_users_function_with_prompt_completion_and_meta(user_module):
    r = terms({"name": "python", "function": f"{user_module}:good"})
    r.terms[0].start()
    s = r("abcd", "7", 3, "stop", prompt="Q: 3 + 4?", meta={"group": "3"})
    assert s.terms == (("python", 0.4 + 1.0 + 0.5),) and s.total == pytest.approx(1.9) and not s.failures
    r.close()


def test_python_term_failures_are_counted_rewarded_zero_and_bounded_in_time(user_module):
    r = terms({"name": "python", "function": f"{user_module}:boom", "label": "boom"},
              {"name": "python", "function": f"{user_module}:slow", "timeout_s": 0.5, "label": "slow"},
              {"name": "python", "function": f"{user_module}:nan", "label": "nan"},
              {"name": "python", "function": f"{user_module}:dies", "label": "dies"})
    s = r("xy", "7", 2, "stop")
    assert s.valid and dict(s.terms) == {"boom": 0.0, "slow": 2.0, "nan": 0.0, "dies": 3.0}
    assert s.failures == ("boom", "nan")
    hang = r("hang", "7", 1, "stop")  # 60 s asleep: cut at timeout_s, its worker killed
    assert hang.failures == ("slow", "nan") and r.terms[1].fn.proc is None
    assert r.terms[1].fn("", "hang", {}) == (None, "timeout")
    assert dict(hang.terms)["slow"] == 0.0
    die = r("die", "7", 1, "stop")
    assert "dies" in die.failures and dict(die.terms)["dies"] == 0.0
    after = r("fine", "7", 1, "stop")  # fresh workers after the timeout and the crash
    assert dict(after.terms) == {"boom": 1.0, "slow": 2.0, "nan": 0.0, "dies": 3.0}
    assert r.terms[1].fn.started == 3 and r.terms[3].fn.started == 2  # a fresh worker after each timeout, the crash
    r.close()


def test_python_term_that_cannot_be_imported_stops_the_stage(user_module):
    for spec, why in ((f"{user_module}:missing", "AttributeError"), ("no_such_module_xyz:f", "ModuleNotFoundError"),
                      (f"{user_module}:not_callable", "not callable")):
        r = terms({"name": "python", "function": spec})
        with pytest.raises(ConfigError, match=why):
            r.terms[0].start()


def test_code_tests_term():
    r = terms({"name": "code_tests", "timeout_s": 3.0, "workers": 2},
              {"name": "format", "pattern": r"(?s).*```python.*", "weight": 0.0})
    tests = "assert sq(2) == 4\nassert sq(3) == 9\nassert sq(0) == 1"
    code = "Here:\n```python\ndef sq(x):\n    return x * x\n```"
    out = r.score_many([TermInput(c, tests, 10, "stop")
                        for c in (code, "no code", "```python\nimport os\nos.fork()\n```")])
    assert [o.total for o in out] == [pytest.approx(2 / 3), 0.0, 0.0]
    assert [o.status for o in out] == ["partial", "no_program", "program_error"]
    assert not out[0].correct
    bad_gold = r(code, "this is not python (", 10, "stop")
    assert not bad_gold.valid and bad_gold.status == "tests_unusable"
    allornone = terms({"name": "code_tests", "mode": "all"})
    assert allornone(code, "assert sq(2) == 4\nassert sq(5) == 25", 10, "stop").correct


# ------------------------------------------------------------------------------------------------ model terms

def test_reward_and_process_model_terms_join_a_grpo_rollout():
    """A real (untrained) reward model's score, weighted, joins each valid sample's total before dynamic sampling;
    the per-term sums ride in the rollout's stats and become history means."""
    torch.manual_seed(0)
    model = tiny_model()
    rm = MistralForValueHead(model.config)
    prm = MistralForProcessReward(model.config)
    reward = RewardConfig(terms=(RewardTermConfig("verifier"), RewardTermConfig("reward_model", 0.5, path="rm"),
                                 RewardTermConfig("process_reward_model", 0.25, path="prm", aggregate="mean")))
    plain = make_source(make_module(tiny_model(), c := make_client(model)), c)
    scored = make_source(make_module(tiny_model(), c2 := make_client(model)), c2, reward=reward,
                         verifier=parity_verifier)
    newline = torch.zeros(64, dtype=torch.bool)
    newline[5] = True  # token 5 starts a line (the parity task's "vocabulary")
    scored.reward.batch_terms[0].scorer = reward_model_scorer(rm)
    scored.reward.batch_terms[1].scorer = process_sequence_scorer(prm, newline, EOS, "mean")
    a, b = next(iter(plain)), next(iter(scored))
    for x, y in zip(a, b):
        assert torch.equal(x["completion_ids"], y["completion_ids"])
        ends = x["completion_start"] + x["completion_mask"].sum(1).long()
        with torch.no_grad():
            own = torch.stack([rm(x["input_ids"][i:i + 1, :int(e)])[0, int(e) - 1] for i, e in enumerate(ends)])
            logits = prm(x["input_ids"], torch.arange(x["input_ids"].shape[1])[None] < ends[:, None])[..., 0]
        pos = x["completion_start"][:, None] + torch.arange(x["completion_ids"].shape[1])[None]
        belief = 2 * torch.sigmoid(logits.gather(1, pos.clamp(max=logits.shape[1] - 1))) - 1
        marks = step_ends(x["completion_ids"], x["completion_mask"], newline, EOS)
        steps = (belief * marks).sum(1) / marks.sum(1).clamp(min=1)
        assert torch.allclose(y["rewards"] - x["rewards"], 0.5 * own + 0.25 * steps, atol=1e-5)
    stats = b[0]["stats"]
    metrics = rollout_metrics(stats)
    assert stats["rollout/samples"] == 16
    assert metrics["rollout/term_mean/reward_model"] == pytest.approx(stats["rollout/term_sum/reward_model"] / 16)
    assert set(k for k in metrics if k.startswith("rollout/term_mean/")) == {
        "rollout/term_mean/verifier", "rollout/term_mean/reward_model", "rollout/term_mean/process_reward_model"}
    assert math.isfinite(metrics["rollout/term_mean/process_reward_model"])


def test_a_model_term_without_its_model_is_refused():
    model = tiny_model()
    reward = RewardConfig(terms=(RewardTermConfig("verifier"), RewardTermConfig("reward_model", path="rm")))
    source = make_source(make_module(tiny_model(), c := make_client(model)), c, reward=reward)
    with pytest.raises(RuntimeError, match="has no model attached"):
        next(iter(source))


def test_receipt_reports_each_terms_means_and_failures(tmp_path):
    path = tmp_path / "history.jsonl"
    h = MetricsHistory(path)
    for step, (v, f) in enumerate([(0.25, 0.0), (None, 0.0), (0.5, 2.0), (0.75, 1.0)], 1):
        h.log(step, {"rollout/term_mean/verifier": float("nan") if v is None else v,
                     "rollout/term_failures/verifier": f})
    got = reward_terms(path, fraction=0.5)
    assert got == {"verifier": {"mean": 0.5, "first": 0.25, "last": 0.75, "points": 3, "failures": 3.0}}
