"""The bundled math task: reproducible bytes, held-out eval disjoint from training, well-formed solutions."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from align.data.bundle import SCHEMAS, BundleConfig, build_tables, write_bundle
from align.data.mathtask import WRONG_KINDS, Step, draw_problem, render_solution, wrong_solution

RAW = Path(__file__).resolve().parents[2] / "data" / "raw"
TRAIN = ("math_sft", "math_pairs", "math_rl", "math_rm_pairs")
BOXED = re.compile(r"\\boxed\{(-?\d+)\}\.$")


@pytest.fixture(scope="module")
def committed() -> dict[str, pa.Table]:
    return {name: pq.read_table(RAW / f"{name}.parquet") for name in SCHEMAS}


def test_generator_reproduces_committed_files_byte_identically(tmp_path):
    record = json.loads((RAW / "GENERATED.json").read_text())
    fresh = write_bundle(tmp_path, BundleConfig())
    assert fresh["config"] == record["config"]
    for name in SCHEMAS:
        committed_table = pq.read_table(RAW / f"{name}.parquet")
        assert pq.read_table(tmp_path / f"{name}.parquet").equals(committed_table), name
    if pa.__version__ != record["pyarrow"]:
        pytest.skip(f"contents equal; bytes compared only under pyarrow {record['pyarrow']} (here {pa.__version__})")
    for name in SCHEMAS:
        assert (tmp_path / f"{name}.parquet").read_bytes() == (RAW / f"{name}.parquet").read_bytes(), name
    assert fresh["files"] == record["files"]


def test_generation_is_deterministic_and_seed_sensitive():
    small = BundleConfig(n_sft=50, n_pairs=20, n_rl=20, n_eval_per_level=5)
    a, b = build_tables(small), build_tables(small)
    assert all(a[n].equals(b[n]) for n in a)
    other = build_tables(BundleConfig(seed=small.seed + 1, n_sft=50, n_pairs=20, n_rl=20, n_eval_per_level=5))
    assert not a["math_sft"].equals(other["math_sft"])


def test_eval_split_shares_no_problem_with_training(committed):
    eval_rows = committed["math_eval"].to_pylist()
    eval_keys = {r["key"] for r in eval_rows}
    eval_texts = {r["prompt"] for r in eval_rows}
    assert len(eval_keys) == len(eval_rows) == 600
    for name in TRAIN:
        rows = committed[name].to_pylist()
        texts = {r["messages"][0]["content"] if name == "math_sft" else r["prompt"] for r in rows}
        # by arithmetic identity (so not even a reworded copy) and by text
        assert not eval_keys & {r["key"] for r in rows}, name
        assert not eval_texts & texts, name


def test_keys_match_the_arithmetic_in_the_text(committed):
    # the disjointness proof rests on `key`: check it is really the problem's arithmetic
    for row in committed["math_eval"].to_pylist():
        numbers = [int(n) for n in re.findall(r"\d+", row["prompt"])]
        key_numbers = [int(n) for n in re.findall(r"\d+", row["key"].split(":", 1)[1])]
        assert numbers == key_numbers, row
        assert row["solution"].endswith(f"\\boxed{{{row['answer']}}}.")


def test_sizes_levels_and_footprint(committed):
    assert committed["math_sft"].num_rows == 6000
    assert committed["math_pairs"].num_rows == 1500
    assert committed["math_rl"].num_rows == 6000
    assert committed["math_rm_pairs"].num_rows == 6000
    # the reward model's prompts repeat no DPO pair's question, so DPO's held-out pairs are new to it as well
    assert not set(committed["math_pairs"].column("prompt").to_pylist()) & set(
        committed["math_rm_pairs"].column("prompt").to_pylist())
    for name, table in committed.items():
        assert set(table.column("level").to_pylist()) == {1, 2, 3, 4}, name
    eval_levels = committed["math_eval"].column("level").to_pylist()
    assert [eval_levels.count(lv) for lv in (1, 2, 3, 4)] == [150] * 4
    rl_levels = committed["math_rl"].column("level").to_pylist()
    assert rl_levels.count(4) > rl_levels.count(3) > rl_levels.count(2) > rl_levels.count(1)  # RL leans hard
    for name, table in committed.items():
        assert len(set(table.column("id").to_pylist())) == table.num_rows, name
    assert sum((RAW / f"{n}.parquet").stat().st_size for n in SCHEMAS) < 5 * 2**20


def _final(text: str) -> int:
    match = BOXED.search(text)
    assert match, text
    return int(match.group(1))


def test_every_step_of_every_solution_is_correct(committed):
    for row in committed["math_sft"].to_pylist():
        question, solution = (m["content"] for m in row["messages"])
        lines = solution.split("\n")
        for line in lines[:-1]:
            a, op, b, result = re.fullmatch(r"(\d+) ([-+*]) (\d+) = (-?\d+)\.", line).groups()
            assert {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op] == int(result), line
        assert _final(lines[-1]) == int(result)


@pytest.mark.parametrize("split", ["math_pairs", "math_rm_pairs"])
def test_rejected_solutions_are_plausible_and_wrong(committed, split):
    rows = committed[split].to_pylist()
    assert {r["error_kind"] for r in rows} == set(WRONG_KINDS)
    for row in rows:
        chosen, rejected = _final(row["chosen"]), _final(row["rejected"])
        assert chosen != rejected and rejected >= 0
        assert row["chosen"].count("\n") == row["rejected"].count("\n")  # same shape, differs in arithmetic


def test_rl_and_eval_gold_answers_are_the_arithmetic_result():
    rng = random.Random(0)
    for level in (1, 2, 3, 4):
        for _ in range(200):
            p = draw_problem(rng, level)
            assert p.answer > 0 and _final(render_solution(p.steps)) == p.answer
            assert len(p.steps) == {1: 1, 2: 1, 3: 2, 4: 3}[level]
            assert all(s.result > 0 for s in p.steps)  # no step leaves zero or fewer objects


def test_wrong_solution_kinds():
    steps = (Step(4, "mul", 6), Step(24, "sub", 5))
    from align.data.mathtask import Problem

    p = Problem(3, steps, "q")
    rng = random.Random(3)
    seen = {kind: wrong_solution(rng, p, kind) for kind in WRONG_KINDS}
    for kind, text in seen.items():
        assert text is not None and _final(text) != 19, kind
    with pytest.raises(ValueError, match="unknown wrong-solution kind"):
        wrong_solution(rng, p, "typo")
