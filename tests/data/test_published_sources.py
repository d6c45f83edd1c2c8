"""Published dataset layouts ingest to the expected records: PRM800K (steps and step-level pairs, the verifier's
agreement with its final-answer labels), Argilla preference exports, MATH / MATH-500 / GSM8K as JSONL, and the
named eval sets. Every fixture is a small file written here in the dataset's own schema."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from align.data.evalsets import EVALSETS, get_evalset, ingest_evalset
from align.data.hub import HttpConfig
from align.data.ingest_parquet import RECORDS, SourceConfig, ingest_source, iter_records
from align.data.outcome_agreement import outcome_agreement
from align.data.schema import StepLabelled
from align.tokenizer import TokenizerConfig
from align.exceptions import ConfigError, DataError
from tests.data.loopback_http import LoopbackServer

ROOT = Path(__file__).resolve().parents[2]


def _jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _c(text, rating, flagged=False):
    return {"text": text, "rating": rating, "flagged": flagged}


def _prm_row(problem, gold, steps, finish="solution", **question):
    return {"labeler": "0f6b", "timestamp": "2023-01-22T04:34:27", "generation": 9,
            "is_quality_control_question": False, "is_initial_screening_question": False,
            "question": {"problem": problem, "ground_truth_answer": gold, **question},
            "label": {"steps": steps, "total_time": 85085, "finish_reason": finish}}


def _step(completions, chosen=0, human=None):
    return {"completions": completions, "human_completion": human, "chosen_completion": chosen}


PHASE1 = _prm_row(  # phase 1: alternatives per step, the labeler picks one; a human step where none was right
    "How many positive two-digit integers leave a remainder of 2 when divided by 8?", "12",
    [_step([_c("A number with remainder 2 is 8n+2.", 1), _c("A number with remainder 2 is 8n.", -1)]),
     _step([_c("So 10 <= 8n+2 <= 99, and 1 <= n <= 12.", 0), _c("So n <= 12.", 0)], chosen=None,
           human={"text": "So 1 <= n <= 12: twelve values.", "rating": None, "source": "human"}),
     _step([_c("# Answer\n\n12", 1)])])
PHASE2_WRONG = _prm_row(  # phase 2: one pre-generated completion per step, stopped at the wrong final answer
    "What is $\\frac{1}{2} + \\frac{1}{4}$?", "\\frac{3}{4}",
    [_step([_c("Add with the common denominator 4: 2/4 + 1/4.", 1)]),
     _step([_c("# Answer\n\n\\frac{2}{4}", -1)], chosen=None)], finish="found_error",
    pre_generated_steps=["..."], pre_generated_answer="\\frac{2}{4}", pre_generated_verifier_score=0.1)
PHASE2_EARLY = _prm_row(  # stopped at an error before any answer: steps, but no final-answer label
    "Compute $2^5$.", "32", [_step([_c("2^5 = 2*2*2*2 = 16.", -1)], chosen=None)], finish="found_error")
DISAGREE = _prm_row(  # the labeler accepted an answer the verifier does not read as the gold
    "Half of 7?", "3.5", [_step([_c("Half of 7 is 3 and a half.", 1)]), _step([_c("# Answer\n\nthree and a half", 1)])])


def test_prm800k_steps_records(tmp_path):
    bad = [_prm_row("Q?", "1", [_step([_c("x", 2)])]),  # not a rating
           _prm_row("Q?", "1", [_step([_c("x", 1)], chosen=3)]),  # chosen index out of range
           {"question": {"ground_truth_answer": "1"}, "label": {"steps": []}}]  # no problem
    path = _jsonl(tmp_path / "phase2_train.jsonl", [PHASE1, PHASE2_WRONG, PHASE2_EARLY, DISAGREE] + bad)
    manifest = ingest_source("prm", SourceConfig(path=str(path), kind="steps", format="prm800k",
                                                 max_reject_fraction=0.5), tmp_path / "out")
    assert (manifest["rows_in"], manifest["rows_out"], manifest["rejected"]) == (7, 4, 3)
    assert [(r["row"], r["column"]) for r in manifest["rejections"]] == [
        (4, "label.steps[0].completions[0].rating"), (5, "label.steps[0].chosen_completion"),
        (6, "question.problem")]
    records = list(iter_records(tmp_path / "out" / RECORDS, "steps"))
    first = records[0]
    assert isinstance(first, StepLabelled) and first.gold == "12"
    assert first.steps == ("A number with remainder 2 is 8n+2.", "So 1 <= n <= 12: twelve values.", "# Answer\n\n12")
    assert first.ratings == (1, 1, 1) and first.prompt[0].content.startswith("How many")
    assert records[1].ratings == (1, -1) and records[1].steps[-1] == "# Answer\n\n\\frac{2}{4}"
    assert records[2].steps == ("2^5 = 2*2*2*2 = 16.",) and records[2].ratings == (-1,)


def test_prm800k_outcome_agreement_is_reported_by_ingest(tmp_path):
    path = _jsonl(tmp_path / "p.jsonl", [PHASE1, PHASE2_WRONG, PHASE2_EARLY, DISAGREE])
    manifest = ingest_source("prm", SourceConfig(path=str(path), kind="steps", format="prm800k"), tmp_path / "out")
    agreement = manifest["outcome_agreement"]
    assert agreement["compared"] == 3 and agreement["agreement"] == pytest.approx(2 / 3)
    assert (agreement["label_right_verifier_right"], agreement["label_wrong_verifier_wrong"],
            agreement["label_right_verifier_wrong"], agreement["label_wrong_verifier_right"]) == (1, 1, 1, 0)
    assert agreement["no_answer_step"] == 1 and agreement["prediction_unreadable"] == 1
    (d,) = agreement["disagreements"]
    assert (d["id"], d["answer"], d["label"]) == ("prm-3", "three and a half", "right")
    on_disk = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert on_disk["outcome_agreement"] == agreement


def test_outcome_agreement_on_records():
    def rec(answer, rating, gold="0.5"):
        return StepLabelled("r", (), ("work", f"# Answer\n\n{answer}"), (1, rating), gold)

    out = outcome_agreement([rec("\\frac{1}{2}", 1), rec("1/2", -1), rec("0.25", -1), rec("0.5", 0)])
    assert (out["compared"], out["label_right_verifier_right"], out["label_wrong_verifier_right"],
            out["label_wrong_verifier_wrong"], out["answer_rated_neutral"]) == (3, 1, 1, 1, 1)
    assert out["agreement"] == pytest.approx(2 / 3)
    assert outcome_agreement([])["agreement"] is None


def test_prm800k_step_level_pairs(tmp_path):
    path = _jsonl(tmp_path / "phase1_train.jsonl", [PHASE1, PHASE2_WRONG, PHASE2_EARLY])
    manifest = ingest_source("prm", SourceConfig(path=str(path), kind="pairs", format="prm800k"), tmp_path / "out")
    assert (manifest["rows_in"], manifest["rows_out"], manifest["rows_empty"]) == (3, 1, 2)
    (pair,) = pq.read_table(tmp_path / "out" / RECORDS).to_pylist()
    assert pair["id"] == "prm-0-s0-0" and pair["prompt"][0]["content"].startswith("How many")
    assert (pair["chosen"], pair["rejected"]) == ("A number with remainder 2 is 8n+2.", "A number with remainder 2 is 8n.")


def test_prm800k_pairs_share_the_chosen_prefix(tmp_path):
    row = _prm_row("Q?", "2", [_step([_c("one", 1)]), _step([_c("two wrong", -1), _c("two right", 1)], chosen=1),
                               _step([_c("# Answer\n\n2", 1), _c("# Answer\n\n3", -1), _c("# Answer\n\n4", -1)])])
    path = _jsonl(tmp_path / "p.jsonl", [row])
    ingest_source("p", SourceConfig(path=str(path), kind="pairs", format="prm800k"), tmp_path / "out")
    pairs = [(r["chosen"], r["rejected"]) for r in pq.read_table(tmp_path / "out" / RECORDS).to_pylist()]
    assert pairs == [("one\ntwo right", "one\ntwo wrong"), ("one\ntwo right\n# Answer\n\n2", "one\ntwo right\n# Answer\n\n3"),
                     ("one\ntwo right\n# Answer\n\n2", "one\ntwo right\n# Answer\n\n4")]


def test_prm800k_as_parquet_structs(tmp_path):
    path = tmp_path / "prm.parquet"
    pq.write_table(pa.Table.from_pylist([PHASE1, DISAGREE]), path)
    manifest = ingest_source("prm", SourceConfig(path=str(path), kind="steps", format="prm800k"), tmp_path / "out")
    assert manifest["rows_out"] == 2 and manifest["outcome_agreement"]["compared"] == 2


def test_argilla_preference_export(tmp_path):
    # the layout of argilla/distilabel-math-preference-dpo: instruction, responses and their ratings
    rows = [{"metadata": "{}", "instruction": "What is 3*4?", "chosen_response": "3*4 = 12.", "chosen_rating": 9.0,
             "rejected_response": "3*4 = 7.", "rejected_rating": 2.0},
            {"metadata": "{}", "instruction": "What is 2+2?", "chosen_response": "4", "chosen_rating": 5.0,
             "rejected_response": "5", "rejected_rating": 5.0},
            {"metadata": "{}", "instruction": "What is 1+1?", "chosen_response": "2", "chosen_rating": None,
             "rejected_response": "3", "rejected_rating": 1.0}]
    path = tmp_path / "argilla.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    src = SourceConfig(path=str(path), kind="pairs", format="argilla_responses", max_reject_fraction=0.5)
    manifest = ingest_source("a", src, tmp_path / "out")
    assert manifest["rejections"] == [{"row": 1, "column": "chosen_rating", "reason": "5.0 is not above "
                                       "rejected_rating 5.0 (a tie or an inverted pair teaches no preference)"}]
    out = pq.read_table(tmp_path / "out" / RECORDS).to_pylist()
    assert [(r["prompt"][0]["content"], r["chosen"], r["rejected"]) for r in out] == [
        ("What is 3*4?", "3*4 = 12.", "3*4 = 7."), ("What is 1+1?", "2", "3")]
    # the ultrafeedback export names its ratings chosen_avg_rating / rejected_avg_rating: renamed columns
    renamed = [{k.replace("_rating", "_avg_rating"): v for k, v in r.items()} for r in rows[:2]]
    pq.write_table(pa.Table.from_pylist(renamed), path)
    src = SourceConfig(path=str(path), kind="pairs", format="argilla_responses", max_reject_fraction=0.5,
                       columns={"chosen_rating": "chosen_avg_rating", "rejected_rating": "rejected_avg_rating"})
    assert ingest_source("a", src, tmp_path / "out")["rejected"] == 1


def test_math_layouts_as_jsonl(tmp_path):
    hendrycks = [{"problem": "Simplify $\\frac{6}{8}$.", "level": "Level 1", "type": "Prealgebra",
                  "solution": "Divide by 2: $\\boxed{\\frac{3}{4}}$."},
                 {"problem": "No box?", "level": "Level 2", "type": "Algebra", "solution": "It is 4."}]
    path = _jsonl(tmp_path / "math_test.jsonl", hendrycks)
    manifest = ingest_source("m", SourceConfig(path=str(path), kind="prompts", format="math", group_column="type",
                                               max_reject_fraction=0.5), tmp_path / "m")
    assert manifest["rejections"] == [{"row": 1, "column": "solution",
                                       "reason": "has no complete non-empty \\boxed{...} answer"}]
    (row,) = pq.read_table(tmp_path / "m" / RECORDS).to_pylist()
    assert (row["gold"], row["group"]) == ("\\frac{3}{4}", "Prealgebra")
    math500 = [{"problem": "Convert $(0,3)$ to polar.", "solution": "... $\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}$",
                "answer": "\\left( 3, \\frac{\\pi}{2} \\right)", "subject": "Precalculus", "level": 2,
                "unique_id": "test/precalculus/807.json"}]
    path = _jsonl(tmp_path / "test.jsonl", math500)
    ingest_source("m5", SourceConfig(path=str(path), kind="prompts", format="math", id_column="unique_id",
                                     group_column="level"), tmp_path / "m5")
    (row,) = pq.read_table(tmp_path / "m5" / RECORDS).to_pylist()
    assert (row["id"], row["gold"], row["group"]) == ("test/precalculus/807.json", "\\left( 3, \\frac{\\pi}{2} \\right)", "2")


def test_gsm8k_published_jsonl(tmp_path):
    rows = [{"question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in "
                         "May. How many clips did Natalia sell altogether in April and May?",
             "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips "
                       "altogether in April and May.\n#### 72"},
            {"question": "Bad?", "answer": "no final line"}]
    path = _jsonl(tmp_path / "train.jsonl", rows)
    manifest = ingest_source("g", SourceConfig(path=str(path), kind="sft", format="gsm8k", max_reject_fraction=0.5),
                             tmp_path / "out")
    assert manifest["rejections"] == [{"row": 1, "column": "answer", "reason": "has no '#### <final answer>' line"}]
    (row,) = pq.read_table(tmp_path / "out" / RECORDS).to_pylist()
    assert row["messages"][1]["content"] == ("Natalia sold 48/2 = 24 clips in May.\nNatalia sold 48+24 = 72 clips "
                                             "altogether in April and May.\nThe answer is \\boxed{72}.")


def test_evalset_registry():
    assert set(EVALSETS) >= {"bundled", "math500", "math", "gsm8k_test"}
    for name in EVALSETS:
        spec = get_evalset(name)
        assert spec.name == name and spec.source.kind == "prompts"
    with pytest.raises(ConfigError, match="unknown eval set 'math5000'; registered: bundled, gsm8k_test"):
        get_evalset("math5000")


def test_bundled_evalset_ingests(tmp_path):
    manifest = ingest_evalset("bundled", tmp_path / "out", base_dir=ROOT, max_rows=50)
    assert manifest["rows_out"] == 50 and manifest["evalset"] == "bundled"
    assert manifest["verify"]["fallback"] is False


def test_math500_evalset_over_http(tmp_path):
    rows = [{"problem": f"What is ${i}+1$?", "solution": f"$\\boxed{{{i + 1}}}$", "answer": str(i + 1),
             "subject": "Algebra", "level": 1 + i % 5, "unique_id": f"test/algebra/{i}.json"} for i in range(20)]
    body = "".join(json.dumps(r) + "\n" for r in rows).encode()
    with LoopbackServer() as server:
        url = server.serve("/datasets/HuggingFaceH4/MATH-500/resolve/main/test.jsonl", body, drops=1)
        manifest = ingest_evalset("math500", tmp_path / "out", url=url, http=HttpConfig(retries=2, backoff_s=0.0))
    assert manifest["rows_out"] == 20 and list(manifest["inputs"]) == [url]
    with pytest.raises(DataError, match="HTTP 404"):
        with LoopbackServer() as server:
            ingest_evalset("math500", tmp_path / "x", url=server.url("/missing.jsonl"))


def test_ingest_worker_reports_outcome_agreement(tmp_path, monkeypatch, capsys):
    from align.exit_codes import run_with_exit_codes
    from align.stages import ingest

    _jsonl(tmp_path / "phase2_test.jsonl", [PHASE1, PHASE2_WRONG, PHASE2_EARLY, DISAGREE])
    (tmp_path / "ingest.toml").write_text('[sources.prm]\npath = "phase2_test.jsonl"\nkind = "steps"\n'
                                          'format = "prm800k"\n')
    (tmp_path / "data/raw").mkdir(parents=True)  # the registered "bundled" eval set every ingest is checked on
    shutil.copy(Path(__file__).resolve().parents[2] / "data/raw/math_eval.parquet", tmp_path / "data/raw")
    monkeypatch.setenv("ALIGN_ROOT", str(tmp_path))
    monkeypatch.setenv("ALIGN_RUN_DIR", str(tmp_path / "run"))
    monkeypatch.setattr("sys.argv", ["ingest", "--config", str(tmp_path / "ingest.toml"), "source=prm"])
    assert run_with_exit_codes(ingest.main) == 0
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["rows_out"] == 4 and metrics["outcome_agreement"]["compared"] == 3
    assert metrics["decontam"] == {"n": 8, "threshold": 0.8, "action": "flag", "references": {"bundled": 600},
                                   "checked": 4, "matched": 0, "dropped": 0}
    assert "disagreements" not in metrics["outcome_agreement"]  # the manifest lists them; the receipt counts
    assert "verifier agrees with the final-answer labels on 0.667 of 3 finished" in capsys.readouterr().out


def test_step_records_are_refused_by_the_chat_shard_build(tmp_path):
    from align.data.shard_build import build_shards
    from align.exceptions import ArtifactError

    path = _jsonl(tmp_path / "p.jsonl", [PHASE1])
    ingest_source("prm", SourceConfig(path=str(path), kind="steps", format="prm800k"), tmp_path / "records")
    with pytest.raises(ArtifactError, match="records of kind 'steps' have no chat-shard layout"):
        build_shards(tmp_path / "records", tmp_path / "shards", TokenizerConfig())
    assert not (tmp_path / "shards").exists()
