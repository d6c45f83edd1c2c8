"""The golden_eval worker on real small artifacts: metrics the receipt carries, published outputs, the golden
regression through an explicit accept, and a changed checkpoint reported with a diff."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from align.eval.golden import accept
from align.inference import EngineConfig
from align.inference.product_kernels import resolve_linear_kernel
from align.inference.paged_attention import resolve_cpu_kernels
from align.model.checkpoint import checkpoint_content_hash
from align.utils.manifest import read_manifest
from eval_fixtures import answer_model, save
from golden_eval_project import build_eval_project, run_golden_eval

CONFIG = """
[checkpoints]
sft = "sft_checkpoint/final"
dpo = "dpo_checkpoint/final"

[data]
threads = 1

[greedy]
max_new_tokens = 24

[sampled]
n = 2
ks = [1, 2]
max_new_tokens = 24
max_examples = 4

[golden]
prompts = 3
max_new_tokens = 24
anchors = "configs/smoke/golden"
"""


@pytest.fixture(scope="module")
def project(eval_project):
    (eval_project / "configs" / "smoke" / "golden_eval.toml").write_text(CONFIG)
    return eval_project


def _eval(root, stage: str) -> tuple[int, dict, str]:
    """(exit code, metrics.json, what the worker printed) of golden_eval:<stage> under CONFIG."""
    return run_golden_eval(root, root / "configs" / "smoke" / "golden_eval.toml", stage)


def test_metrics_outputs_and_golden_regression(project):
    code, m, _ = _eval(project, "sft")
    assert code == 0
    ckpt = project / "runs/smoke/sft_checkpoint/final"
    assert m["accuracy"] == pytest.approx(0.5) and m["examples"] == 6
    assert m["pass_at_k"] == {"1": pytest.approx(0.5), "2": pytest.approx(0.5)}  # golds of rows 0-3: 7, 3, 7, 12
    assert m["format_rate"] == 1.0 and m["truncation_rate"] == 0.0 and m["mean_length"] == 10.0
    assert m["checkpoint_content_hash"] == checkpoint_content_hash(ckpt)
    assert len(m["eval_set_hash"]) == 64 and m["eval_set_hash"] != m["sampled_set_hash"]
    assert m["roundtrip"]["forward_equal"] and m["golden"]["status"] == "no_anchor"
    assert m["engine_linear_kernel"] == resolve_linear_kernel("auto", torch.ones(1))  # fp32 CPU weights, "auto"
    cfg = json.loads((ckpt / "config.json").read_text())  # "auto": native where its shapes fit and it builds
    assert m["engine_cpu_kernels"] == resolve_cpu_kernels(
        "auto", torch.device("cpu"), torch.float32, cfg["num_attention_heads"], cfg["num_key_value_heads"],
        cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"], EngineConfig().block_size)
    out = project / "runs/smoke/golden_eval/sft/out"
    manifest = read_manifest(out, kind="golden_eval", verify_hashes=True)
    assert set(manifest["files"]) == {"samples.jsonl", "golden.json"}
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == 6 + 4 * 2 and sum(r["reward"] for r in rows if r["pass"] == "greedy") == 3

    assert accept(project, "smoke") == [f"sft: anchor updated (no_anchor before, 1 checkpoint(s)) -> "
                                        f"{project / 'configs/smoke/golden/sft.json'}"]
    code, m, _ = _eval(project, "sft")
    assert code == 0 and m["golden"]["status"] == "match" and m["golden"]["passed"]

    save(answer_model(r"The answer is \boxed{12}."), ckpt.parent / "new")  # a retrained rung
    shutil.rmtree(ckpt)
    (ckpt.parent / "new").rename(ckpt)
    code, m, said = _eval(project, "sft")
    golden = m["golden"]
    assert code == 0 and golden["status"] == "checkpoint_changed" and not golden["passed"]
    assert golden["differing"] == 3 and golden["first_diff"]["id"] == "ev-0"
    assert r"+The answer is \boxed{12}." in golden["first_diff"]["diff"]
    assert m["accuracy"] == pytest.approx(1 / 6)
    assert "golden: 3 of 3 differ; first, ev-0:" in said


@pytest.mark.parametrize("stage,said", [("ppo", "stage = 'ppo' is not a key of [checkpoints]"),
                                        ("dpo", "dpo_checkpoint/final: does not exist")])  # declared, not built
def test_an_unknown_stage_or_missing_checkpoint_is_bad_input(project, stage, said):
    code, _, printed = _eval(project, stage)
    assert code == 2 and said in printed


@pytest.fixture(scope="module")
def decimal_project(tmp_path_factory):
    """A model that answers 0.1429 to every prompt, on golds where only the numeric-vs-exact tolerance decides."""
    return build_eval_project(tmp_path_factory.mktemp("decimal"), [r"\frac{1}{7}", "1/7", "0.1429", "2/7"],
                              r"The answer is \boxed{0.1429}.")


@pytest.mark.parametrize("evalset,accuracy", [("", 1 / 4), ("gsm8k_test", 3 / 4), ("math500", 3 / 4)])
def test_answers_are_judged_with_the_eval_sets_verify_settings(decimal_project, evalset, accuracy):
    """[data] evalset names the registered set the shards hold: its verifier settings judge (a decimal of 1/7 counts
    there); none named: the reward's (it does not). The receipt says whose settings judged."""
    config = decimal_project / "configs" / "smoke" / f"eval-{evalset or 'none'}.toml"
    text = CONFIG.replace('anchors = "configs/smoke/golden"\n', "")  # no anchor: the golden pass is not the point
    config.write_text(text.replace("[data]\n", f'[data]\nevalset = "{evalset}"\n'))
    code, m, _ = run_golden_eval(decimal_project, config, "sft")
    assert code == 0 and m["accuracy"] == pytest.approx(accuracy) and m["judged_with"] == (evalset or "reward")
    rows = [json.loads(line) for line in (decimal_project / "runs/smoke/golden_eval/sft/out/samples.jsonl")
            .read_text().splitlines() if '"greedy"' in line]
    assert [r["status"] for r in rows] == (["wrong", "wrong", "correct", "wrong"] if not evalset else
                                           ["correct", "correct", "correct", "wrong"])


def test_an_unknown_eval_set_is_bad_input(decimal_project):
    config = decimal_project / "configs" / "smoke" / "eval-typo.toml"
    config.write_text(CONFIG.replace("[data]\n", '[data]\nevalset = "gsm8k"\n'))
    code, _, printed = run_golden_eval(decimal_project, config, "sft")
    assert code == 2 and "gsm8k" in printed and "gsm8k_test" in printed and str(config) in printed
