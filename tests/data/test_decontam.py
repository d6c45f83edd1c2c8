"""Decontamination: the bundled training splits hold no held-out problem (0 matches, records byte-identical with the
check on); a source made of eval rows re-cased, re-spaced, re-punctuated, wrapped and lightly reworded is caught
row for row, flagged or dropped."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from align.data.decontam import DecontamConfig, grams, load_references, words
from align.data.ingest_parquet import SourceConfig, ingest_source
from align.data.pretrain_corpus import CorpusConfig, CorpusSourceConfig, build_corpus
from align.data.schema import Message, OutcomePrompt
from align.exceptions import ConfigError
from align.tokenizer import Tokenizer
from align.utils.fsio import sha256_file

ROOT = Path(__file__).resolve().parents[2]
BUNDLED = {  # the tiny profile's training sources (configs/tiny/ingest.toml)
    "math_sft": SourceConfig(path="data/raw/math_sft.parquet", kind="sft", format="messages", id_column="id",
                             group_column="level"),
    "math_pairs": SourceConfig(path="data/raw/math_pairs.parquet", kind="pairs", format="pair_columns",
                               id_column="id", group_column="level"),
    "math_rl": SourceConfig(path="data/raw/math_rl.parquet", kind="prompts", format="prompt_answer", id_column="id",
                            group_column="level"),
}
EVAL = SourceConfig(path="data/raw/math_eval.parquet", kind="prompts", format="prompt_answer", id_column="id",
                    group_column="level")


@pytest.fixture(scope="module")
def refs():
    return load_references(DecontamConfig(), {}, ROOT)


def test_normalisation_ignores_case_spacing_punctuation_and_glued_digits():
    assert words("Tom  has5 STICKERS.\n He picks-up 8 more?") == ["tom", "has", "5", "stickers", "he", "picks",
                                                                  "up", "8", "more"]
    assert grams(["a", "b"], 3) == {("a", "b")}  # shorter than n: one gram of all its words
    assert len(grams(list("abcdefghij"), 8)) == 3


@pytest.mark.parametrize("name", sorted(BUNDLED))
def test_the_bundled_training_splits_hold_no_held_out_problem(refs, name, tmp_path):
    """The bundled task reports 0, and checking changes no byte of the records (flag never drops)."""
    src = BUNDLED[name]
    checked = ingest_source(name, src, tmp_path / "checked", ROOT, screen=refs.screen(name, src.location))
    plain = ingest_source(name, src, tmp_path / "plain", ROOT)
    report = checked["decontam"]
    assert report["references"] == {"bundled": 600}
    assert (report["checked"], report["matched"], report["dropped"]) == (checked["rows_out"], 0, 0)
    assert checked["files"] == plain["files"]
    assert sha256_file(tmp_path / "checked/records.parquet") == sha256_file(tmp_path / "plain/records.parquet")


def test_the_nearest_bundled_training_problem_stays_below_the_threshold(refs):
    """The held-out split truly does not overlap: the closest training problem is a templated sibling (another
    number), well under the threshold, while the eval problem itself scores 1.0."""
    train = pq.read_table(ROOT / "data/raw/math_rl.parquet").column("prompt").to_pylist()
    evals = pq.read_table(ROOT / "data/raw/math_eval.parquet").column("prompt").to_pylist()
    strict = dataclasses.replace(refs.cfg, threshold=1e-9)
    probe = load_references(strict, {}, ROOT)

    def best(text):
        hit = probe.match(OutcomePrompt("x", (Message("user", text),), "0"))
        return 0.0 if hit is None else hit.overlap

    assert max(best(t) for t in train) < 0.7
    assert all(best(e) == 1.0 for e in evals[:20])


def _contaminated(tmp_path: Path) -> tuple[Path, list[str]]:
    """200 bundled SFT rows, then 40 held-out problems disguised five ways (8 each) as SFT conversations."""
    clean = pq.read_table(ROOT / "data/raw/math_sft.parquet").slice(0, 200).to_pylist()
    evals = pq.read_table(ROOT / "data/raw/math_eval.parquet").slice(0, 40).to_pylist()
    disguises = [
        lambda q: q.upper(),  # re-cased
        lambda q: q.replace("has ", "has").replace(" ", "  "),  # re-spaced, a number glued to its word
        lambda q: q.replace(".", " ;").replace("?", " ??"),  # re-punctuated
        lambda q: f"Solve the following problem step by step.\n\n{q}\n\nPut the answer in a box.",  # wrapped
        lambda q: q.replace(" now?", " in the end?"),  # lightly reworded at its end
    ]
    rows = [{"id": r["id"], "messages": r["messages"]} for r in clean]
    for i, e in enumerate(evals):
        question = disguises[i % len(disguises)](e["prompt"])
        rows.append({"id": f"leak-{e['id']}", "messages": [{"role": "user", "content": question},
                                                            {"role": "assistant", "content": e["solution"]}]})
    path = tmp_path / "leaky.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path, [f"leak-{e['id']}" for e in evals]


@pytest.mark.parametrize("action", ["flag", "drop"])
def test_a_contaminated_source_is_caught_row_for_row(tmp_path, action):
    path, leaked = _contaminated(tmp_path)
    refs = load_references(DecontamConfig(action=action, max_examples=3), {}, ROOT)
    src = SourceConfig(path=str(path), kind="sft", format="messages", id_column="id")
    manifest = ingest_source("leaky", src, tmp_path / "out", ROOT, screen=refs.screen("leaky", src.location))
    report = manifest["decontam"]
    assert (report["checked"], report["matched"], report["matched_by_set"]) == (240, 40, {"bundled": 40})
    assert [e["reference"] for e in report["examples"]] == [f"bundled:{i[len('leak-'):]}" for i in leaked[:3]]
    assert [e["row"] for e in report["examples"]] == [200, 201, 202]
    kept = pq.read_table(tmp_path / "out/records.parquet").column("id").to_pylist()
    if action == "drop":
        assert report["dropped"] == 40 and manifest["rows_out"] == 200 and not set(kept) & set(leaked)
    else:
        assert report["dropped"] == 0 and manifest["rows_out"] == 240 and report["flagged_ids"] == leaked


def test_a_held_out_source_is_a_reference_and_is_not_checked_against_itself(tmp_path):
    sources = {"mine": EVAL, "train": BUNDLED["math_rl"]}
    refs = load_references(DecontamConfig(evalsets=(), heldout=("mine",)), sources, ROOT)
    assert refs.counts == {"heldout:mine": 600}
    assert "held out" in refs.screen("mine", EVAL.location).report()["skipped"]
    other = dataclasses.replace(EVAL, max_rows=5)  # the same file under another name: still the reference
    assert "evaluation set 'heldout:mine'" in refs.screen("copy", other.location).report()["skipped"]
    with pytest.raises(ConfigError, match="decontam.heldout: 'nope' is not a configured source"):
        load_references(DecontamConfig(heldout=("nope",)), sources, ROOT)


def test_the_bundled_eval_source_is_recognised_as_the_registered_set(refs):
    report = refs.screen("math_eval", EVAL.location).report()
    assert report["skipped"] == "source 'math_eval' is the evaluation set 'bundled'" and report["matched"] == 0


def test_config_is_checked():
    with pytest.raises(ValueError, match="threshold must be in"):
        DecontamConfig(threshold=0.0)
    with pytest.raises(ValueError, match="n must be >= 1"):
        DecontamConfig(n=0)


@pytest.mark.parametrize("action", ["flag", "drop"])
def test_a_pretraining_corpus_is_checked_document_by_document(tmp_path, action):
    """[corpus.decontam]: the bundled corpus holds no held-out problem; one glued into a story is caught."""
    stories = pq.read_table(ROOT / "data/corpus/stories.parquet").column("text").to_pylist()[:300]
    problem = pq.read_table(ROOT / "data/raw/math_eval.parquet").column("prompt").to_pylist()[7]
    stories[41] = f"{stories[41]} {problem.lower()} {stories[42]}"
    pq.write_table(pa.Table.from_pylist([{"text": t} for t in stories]), tmp_path / "stories.parquet")
    (tmp_path / "data").symlink_to(ROOT / "data")  # the bundled eval set, where the registry names it
    tok = Tokenizer.from_pretrained()
    checked = CorpusConfig(sources={"s": CorpusSourceConfig(path="stories.parquet")},
                           decontam=DecontamConfig(action=action))
    corpus = build_corpus(checked, tok, tmp_path)
    report = corpus.stats["s"]["decontam"]
    assert (report["checked"], report["matched"], report["examples"][0]["row"]) == (300, 1, 41)
    assert report["examples"][0]["reference"] == "bundled:eval-00007"
    plain = build_corpus(dataclasses.replace(checked, decontam=None), tok, tmp_path)
    assert "decontam" not in plain.stats["s"]
    kept = len(plain.train) + len(plain.heldout) - (action == "drop")
    assert len(corpus.train) + len(corpus.heldout) == kept
    bundled = dataclasses.replace(checked, sources={"s": CorpusSourceConfig(path="data/corpus/stories.parquet"),
                                                    "f": CorpusSourceConfig(path="data/corpus/facts.parquet")})
    stats = build_corpus(bundled, tok, tmp_path).stats
    assert [(stats[s]["decontam"]["checked"], stats[s]["decontam"]["matched"]) for s in ("f", "s")] == \
        [(1500, 0), (3000, 0)]
