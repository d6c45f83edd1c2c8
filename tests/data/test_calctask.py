"""The calculator task (align.data.calctask): reproducible bytes, held-out eval disjoint from training, the tool-use
share of the demonstrations, and how a tool-calling demonstration trains: the tool turn (the calculator's result)
carries zero loss weight, the call and the answer carry it (checked on the shards' own encoding, and against
transformers' `apply_chat_template(return_assistant_tokens_mask=True)` under the oracle marker)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from align.data.calctask import SCHEMAS, CalcConfig, build_calc_tables, expression, tool_messages, write_calc
from align.data.encoding import EncodingConfig, encode_record
from align.data.mathtask import Problem, Step
from align.data.sources import make_record
from align.rl.env_chat import tool_turns_for
from align.rl.environment import CalculatorEnv, call_expression
from align.tokenizer import Tokenizer

ROOT = Path(__file__).resolve().parents[2]
RAW = ROOT / "data" / "raw"
TOKENIZER = ROOT / "assets" / "tokenizer" / "qwen3-calc-tiny"


@pytest.fixture(scope="module")
def committed() -> dict[str, pa.Table]:
    return {name: pq.read_table(RAW / f"{name}.parquet") for name in SCHEMAS}


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_pretrained(TOKENIZER)


def test_generator_reproduces_committed_files(tmp_path):
    record = json.loads((RAW / "GENERATED.json").read_text())["calc"]
    assert record["config"] == json.loads(json.dumps(CalcConfig().__dict__))
    hashes = write_calc(tmp_path, CalcConfig())
    for name in SCHEMAS:
        assert pq.read_table(tmp_path / f"{name}.parquet").equals(pq.read_table(RAW / f"{name}.parquet")), name
    if pa.__version__ != json.loads((RAW / "GENERATED.json").read_text())["pyarrow"]:
        pytest.skip("contents equal; bytes compared only under the recorded pyarrow version")
    assert hashes == record["files"]


def test_generation_is_deterministic_and_seed_sensitive():
    small = CalcConfig(n_sft=60, n_rl=30, n_eval_per_level=5)
    a, b = build_calc_tables(small), build_calc_tables(small)
    assert all(a[n].equals(b[n]) for n in a)
    other = build_calc_tables(CalcConfig(seed=small.seed + 1, n_sft=60, n_rl=30, n_eval_per_level=5))
    assert not a["calc_sft"].equals(other["calc_sft"])


def test_eval_shares_no_arithmetic_with_training(committed):
    evals = committed["calc_eval"].to_pylist()
    keys, texts = {r["key"] for r in evals}, {r["prompt"] for r in evals}
    assert len(keys) == len(evals) == 300
    sft, rl = committed["calc_sft"].to_pylist(), committed["calc_rl"].to_pylist()
    assert not keys & {r["key"] for r in sft} and not keys & {r["key"] for r in rl}
    assert not texts & {r["messages"][0]["content"] for r in sft} and not texts & {r["prompt"] for r in rl}
    for r in evals:  # the key is the arithmetic of the text, and the answer its value
        assert [int(n) for n in re.findall(r"\d+", r["prompt"])] == [
            int(n) for n in re.findall(r"\d+", r["key"].split(":", 1)[1])]
        env = CalculatorEnv()
        env.reset("", {"gold": r["answer"]})
        assert env.step(f"<calc>{r['expression']}</calc>").observation == f"<result>{r['answer']}</result>\n"


def test_levels_numbers_and_tool_share(committed):
    sft = committed["calc_sft"].to_pylist()
    share = sum(r["tool_use"] for r in sft) / len(sft)
    assert 0.22 < share < 0.28  # calc_share 0.25
    for r in sft:
        if r["tool_use"]:
            call = json.loads(r["messages"][1]["tool_calls"])[0]["function"]
            answer = re.fullmatch(r"The answer is \\boxed\{(\d+)\}\.", r["messages"][3]["content"]).group(1)
            assert r["messages"][2]["content"] == f"<result>{answer}</result>"
            assert call["name"] == "calculator"
        nums = [int(n) for n in re.findall(r"\d+", r["messages"][0]["content"])]
        assert (max(nums) <= 20) if r["level"] == 1 else (max(nums) >= 100)
    assert {r["level"] for r in sft} == {1, 2, 3}


def test_tool_call_text_encodes_and_decodes_exactly(tok):
    p = Problem(3, (Step(347, "mul", 29),), "q")
    assert expression(p) == "347 * 29"
    call = tok.chat.renderer.text([{"role": "user", "content": "q"}, {
        "role": "assistant", "content": "", "tool_calls": json.loads(tool_messages(p)[1]["tool_calls"])}], False)
    policy = call[call.index("<think>"):]
    ids = tok.encode(policy, parse_special=True)
    assert tok.decode(ids, skip_special_tokens=False) == policy
    # what the rollout decodes (special tokens skipped) still holds the call the environment parses
    assert call_expression(tok.decode(ids, skip_special_tokens=True)) == "347 * 29"
    for text in ("<result>10063</result>", "<calc>347 * 29</calc>", "9393 + 5853"):
        assert tok.decode(tok.encode(text)) == text


def weighted_text(tok, ids, mask, weight):
    return "".join(tok.decode([int(i)], skip_special_tokens=False) for i, m in zip(ids, mask) if m == weight)


def encoded_tool_row(tok, committed):
    row = next(r for r in committed["calc_sft"].to_pylist() if r["tool_use"])
    enc = encode_record(tok, make_record("messages", "sft", row, row["id"], str(row["level"])),
                        EncodingConfig(max_len=512))
    return row, list(enc.ids[0]), list(enc.masks[0])


def test_tool_result_carries_no_loss_weight(tok, committed):
    """The shards' encoding of a tool-calling demonstration: the call and the answer train, the tool turn (what the
    environment wrote, and the next assistant header) does not. Fails if the tool result is weighted."""
    row, ids, mask = encoded_tool_row(tok, committed)
    result = row["messages"][2]["content"]
    trained, untrained = weighted_text(tok, ids, mask, 1), weighted_text(tok, ids, mask, 0)
    assert result not in trained and "<tool_response>" not in trained
    assert result in untrained
    assert '"expression": "' + json.loads(row["messages"][1]["tool_calls"])[0]["function"]["arguments"][
        "expression"] + '"' in trained
    assert row["messages"][3]["content"] in trained and trained.count("<|im_end|>") == 2
    # the tokens after the call's end-of-turn are exactly the tool turn the rollout appends (align.rl.env_chat),
    # untrained (its leading newline aside: SFT trains the template's newline after <|im_end|>, RL never samples it)
    turn = tool_turns_for(tok, "tool_turn")(CalculatorEnv().step(f"<calc>{result[8:-9]}</calc>").observation)
    end = [i for i, t in enumerate(ids) if t == tok.eos_id][1]
    assert ids[end + 1:end + 1 + len(turn)] == turn
    assert mask[end + 2:end + 1 + len(turn)] == [0] * (len(turn) - 1)


@pytest.mark.oracle
def test_mask_matches_transformers_assistant_tokens_mask(tok, committed):
    transformers = pytest.importorskip("transformers")
    hf = transformers.PreTrainedTokenizerFast.from_pretrained(str(TOKENIZER))
    row, ids, mask = encoded_tool_row(tok, committed)
    messages = [dict(m, tool_calls=json.loads(m["tool_calls"])) if m["tool_calls"] else
                {"role": m["role"], "content": m["content"]} for m in row["messages"]]
    out = hf.apply_chat_template(messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    assert out["input_ids"] == ids
    assert out["assistant_masks"] == mask
