"""align.eval.golden: verdicts against anchors, the first-difference diff, and the explicit accept command."""

from __future__ import annotations

import json

import pytest

from align.eval.golden import accept, compare, golden_record, main, read_anchor


def _record(texts, ckpt="c1", prompts=None):
    prompts = prompts or [f"p{i}" for i in range(len(texts))]
    return golden_record("sft", ckpt, [{"id": f"ev-{i}", "prompt_sha256": p, "text": t, "tokens": 3}
                                       for i, (t, p) in enumerate(zip(texts, prompts))])


def test_identical_texts_match_even_from_another_checkpoint():
    anchor = _record(["a", "b"])
    assert compare(_record(["a", "b"]), anchor)["status"] == "match"
    v = compare(_record(["a", "b"], ckpt="c2"), anchor)
    assert v["status"] == "match" and v["passed"] and v["differing"] == 0


def test_a_changed_text_is_a_mismatch_with_a_diff_of_the_first_difference():
    anchor = _record(["same", "one\ntwo\nthree", "x"])
    v = compare(_record(["same", "one\nTWO\nthree", "y"]), anchor)
    assert v["status"] == "mismatch" and not v["passed"]
    assert v["differing"] == 2 and v["first_diff"]["id"] == "ev-1"
    assert "-two" in v["first_diff"]["diff"] and "+TWO" in v["first_diff"]["diff"]


def test_other_verdicts():
    anchor = _record(["a", "b"])
    assert compare(_record(["a", "c"], ckpt="c2"), anchor)["status"] == "checkpoint_changed"
    assert compare(_record(["a", "b"], prompts=["p0", "zz"]), anchor)["status"] == "prompts_changed"
    v = compare(_record(["a"]), None)
    assert v["status"] == "no_anchor" and not v["passed"]


def _tree(tmp_path, stages):
    (tmp_path / "configs/smoke").mkdir(parents=True)
    (tmp_path / "configs/smoke/golden_eval.toml").write_text('[golden]\nanchors = "configs/smoke/golden"\n')
    for stage, texts in stages.items():
        out = tmp_path / f"runs/smoke/golden_eval/{stage}/out"
        out.mkdir(parents=True)
        (out / "golden.json").write_text(json.dumps(_record(texts)))
    return tmp_path


def test_accept_copies_the_latest_decodes_and_reports_no_change_after(tmp_path, capsys):
    root = _tree(tmp_path, {"sft": ["a"], "dpo": ["b"]})
    assert main(["accept", "--profile", "smoke", "--root", str(root)]) == 0
    out = capsys.readouterr().out
    assert "dpo: anchor updated (no_anchor before" in out and "sft: anchor updated" in out
    anchor = read_anchor(root / "configs/smoke/golden/sft.json")
    assert compare(_record(["a"]), anchor)["status"] == "match"
    assert accept(root, "smoke", ["sft"]) == ["sft: unchanged"]


def test_accept_refuses_a_stage_with_no_decode(tmp_path):
    root = _tree(tmp_path, {"sft": ["a"]})
    with pytest.raises(SystemExit, match="no golden decode for grpo"):
        accept(root, "smoke", ["grpo"])


def test_an_anchor_of_another_format_is_refused(tmp_path):
    path = tmp_path / "sft.json"
    path.write_text(json.dumps({"format": 99}))
    with pytest.raises(ValueError, match="format 99"):
        read_anchor(path)


def test_an_anchor_holds_several_hosts_checkpoints_and_checks_each_exactly(tmp_path):
    root = _tree(tmp_path, {"sft": ["a", "b"]})
    accept(root, "smoke", ["sft"])
    other = root / "runs/smoke/golden_eval/sft/out/golden.json"
    other.write_text(json.dumps(_record(["a", "c"], ckpt="c2")))  # another host trained another checkpoint
    lines = accept(root, "smoke", ["sft"], add=True)
    assert "entry added" in lines[0] and "2 checkpoint(s)" in lines[0]
    anchor = read_anchor(root / "configs/smoke/golden/sft.json")
    assert [e["checkpoint_content_hash"] for e in anchor["entries"]] == ["c1", "c2"]
    for ckpt, texts in (("c1", ["a", "b"]), ("c2", ["a", "c"])):  # each host's checkpoint matches its own entry
        v = compare(_record(texts, ckpt=ckpt), anchor)
        assert v["status"] == "match" and v["recorded_checkpoint"]
    v = compare(_record(["a", "x"], ckpt="c2"), anchor)  # a recorded checkpoint decoding otherwise: the engine
    assert v["status"] == "mismatch" and v["anchor_checkpoint_content_hash"] == "c2"
    v = compare(_record(["z", "x"], ckpt="c3"), anchor)
    assert v["status"] == "checkpoint_changed" and len(v["anchor_hosts"]) == 2
    assert "updated" in accept(root, "smoke", ["sft"])[0]  # without --add: this checkpoint alone
    assert len(read_anchor(root / "configs/smoke/golden/sft.json")["entries"]) == 1
