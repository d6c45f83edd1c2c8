"""Process reward encoding through a Jinja chat template (align.reward.rm_process.encode_steps on the bundled
qwen3-tiny tokenizer directory: Qwen 3's byte-level BPE and its chat template): the sequence is the tokenizer's own
chat encoding of the reply, and each step's label sits on the step's last token; the oracle test finds the same
positions with transformers alone (its render, its tokenizer's offsets)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from align.data.encoding import DEFAULT_DATE_STRING
from align.data.schema import Message, StepLabelled
from align.exceptions import DataError
from align.reward.rm_process import PrmLossConfig, encode_steps
from align.tokenizer import Tokenizer

QWEN3_TINY = Path(__file__).resolve().parents[2] / "assets" / "tokenizer" / "qwen3-tiny"
RECORDS = [
    StepLabelled("a", (Message("user", "What is 3 + 4 + 5?"),),
                 ("3 + 4 is 7, so.", "7 + 5 is 13, so.", "The answer is 13."), (1, -1, 0), "12"),
    StepLabelled("b", (Message("system", "Answer step by step."), Message("user", "What is 12 - 5?")),
                 ("12 - 5 = 7.", "The answer is \\boxed{7}."), (1, 1), "7"),
]


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.from_pretrained(str(QWEN3_TINY))


def _messages(record: StepLabelled) -> list[dict]:
    return ([{"role": m.role, "content": m.content} for m in record.prompt]
            + [{"role": "assistant", "content": "\n".join(record.steps)}])


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: r.id)
def test_step_ends_on_a_jinja_template(tok, record):
    enc = encode_steps(tok, record, PrmLossConfig(neutral="ignore"))
    assert enc.ids == tok.encode_chat(_messages(record)).ids  # the sequence a policy writes, in this chat format
    labelled = [k for k, r in enumerate(record.ratings) if r != 0]
    assert len(enc.step_ends) == len(labelled)
    for k, end in zip(labelled, enc.step_ends):
        through = tok.decode(enc.ids[:end + 1])  # the step's last token (with the line break when merged: ".\n")
        assert through.endswith(record.steps[k]) or through.endswith(record.steps[k] + "\n")
        assert record.steps[k] not in tok.decode(enc.ids[:end])
        after = tok.decode(enc.ids[end + 1:]).lstrip("\n")  # the next step, or the turn's closing
        assert after.startswith(record.steps[k + 1] if k + 1 < len(record.steps) else "<|im_end|>")


def test_a_step_ending_in_punctuation_takes_the_merged_line_break_token(tok):
    """Qwen's pre-tokenizer keeps "." and the newline after it in one piece (".\n"): the label sits there."""
    enc = encode_steps(tok, RECORDS[0], PrmLossConfig())
    assert tok.id_to_token(enc.ids[enc.step_ends[0]]) == ".Ċ"
    assert tok.id_to_token(enc.ids[enc.step_ends[-1]]) == "."  # the last step: its own "." before <|im_end|>


def test_a_template_without_a_closing_special_token_is_refused(tmp_path):
    directory = tmp_path / "tok"
    shutil.copytree(QWEN3_TINY, directory)
    (directory / "chat_template.jinja").write_text(
        "{% for m in messages %}{{ m.role }}: {{ m.content }}\n\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}", encoding="utf-8")
    with pytest.raises(DataError, match=r"record .a.: .*tok/tokenizer\.json: the chat format's assistant turn has "
                                        r"no closing special token"):
        encode_steps(Tokenizer.from_pretrained(str(directory)), RECORDS[0], PrmLossConfig())


@pytest.mark.oracle
@pytest.mark.parametrize("record", RECORDS, ids=lambda r: r.id)
def test_step_ends_match_transformers_offsets(tok, record):
    transformers = pytest.importorskip("transformers")
    theirs = transformers.AutoTokenizer.from_pretrained(str(QWEN3_TINY))
    text = theirs.apply_chat_template(_messages(record), tokenize=False, date_string=DEFAULT_DATE_STRING)
    out = theirs(text, add_special_tokens=False, return_offsets_mapping=True)
    enc = encode_steps(tok, record, PrmLossConfig(neutral="positive"))
    assert enc.ids == list(out["input_ids"])
    reply = text.rindex("\n".join(record.steps))
    expected = []
    for k in range(len(record.steps)):
        char_end = reply + len("\n".join(record.steps[:k + 1]))
        expected.append(next(i for i, (a, b) in enumerate(out["offset_mapping"]) if b >= char_end))
        token_end = out["offset_mapping"][expected[-1]][1]  # the step's end, or the line break merged after it
        assert token_end == char_end or text[char_end:token_end] == "\n"
    assert enc.step_ends == expected
