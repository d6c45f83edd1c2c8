"""The calculator task: word problems in the bundled task's wording whose numbers a tiny model cannot add or multiply
by hand, so that calling the calculator tool is the way to the answer (the `calc_tiny` profile's rung, where GRPO
learns to call it; align.rl.environment.CalculatorEnv answers the calls).

- level 1: the bundled task's level 1 (1-20 plus or minus 1-9): hand arithmetic works; the tool is not needed.
- level 2: four-digit sums and differences (1000-9999 plus or minus 1000-9999, never below 1).
- level 3: a product of 100-999 containers x 11-99 objects in each.

SFT demonstrations (`calc_sft`): a minority (`calc_share`) solve a problem by calling the calculator, in the
Hugging Face tool layout the chat template renders (an assistant turn with one `tool_calls` entry
`calculator(expression="347 * 29")`, the `tool` turn `<result>10063</result>` as CalculatorEnv answers it, then
`The answer is \\boxed{10063}.`); the rest write the arithmetic by hand, correctly, as the bundled task does
(`347 * 29 = 10063.`). So the SFT policy calls the tool only sometimes and, on levels 2-3, is mostly wrong when it
does not: only the reward can teach it that the call is the way. The tool turn is the environment's text: SFT gives
it zero loss weight as every template's tool turn (align.data.encoding), as GRPO does the observation tokens.
RL prompts (`calc_rl`: prompt + gold answer) and held-out eval (`calc_eval`) are the bundled task's layouts; the eval
problems are drawn first and their arithmetic keys (`mathtask.Problem.key`) are banned from every training split.

Pure and seeded like align.data.bundle (the same pinned writer options, so the files are byte-identical for the
same seed and pyarrow version; data/generate.py writes them and records their hashes in GENERATED.json)."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from align.data.bundle import unique_problems, write_table
from align.data.mathtask import SYMBOL, Problem, Step, draw_problem, render_solution, word_problem
from align.utils.fsio import sha256_file

TOOL_NAME = "calculator"
LEVELS = (1, 2, 3)
CALL_MESSAGE = pa.struct([("role", pa.string()), ("content", pa.string()), ("tool_calls", pa.string())])
SCHEMAS = {
    "calc_sft": pa.schema([("id", pa.string()), ("level", pa.int8()), ("key", pa.string()),
                           ("tool_use", pa.bool_()), ("messages", pa.list_(CALL_MESSAGE))]),
    "calc_rl": pa.schema([("id", pa.string()), ("level", pa.int8()), ("key", pa.string()),
                          ("prompt", pa.string()), ("answer", pa.string())]),
    "calc_eval": pa.schema([("id", pa.string()), ("level", pa.int8()), ("key", pa.string()),
                            ("prompt", pa.string()), ("answer", pa.string()), ("expression", pa.string())]),
}


@dataclass(frozen=True)
class CalcConfig:
    """Sizes and mixtures of the calculator task. `calc_share`: the SFT demonstrations that call the tool."""

    seed: int = 20261207
    n_sft: int = 4000
    n_rl: int = 4000
    n_eval_per_level: int = 100
    calc_share: float = 0.25
    level_mix: tuple[float, ...] = (0.2, 0.4, 0.4)
    rl_level_mix: tuple[float, ...] = (0.1, 0.45, 0.45)

    def __post_init__(self):
        for name in ("level_mix", "rl_level_mix"):
            if len(getattr(self, name)) != len(LEVELS):
                raise ValueError(f"CalcConfig.{name}: one weight per level {LEVELS}, got {getattr(self, name)}")
        if not 0.0 <= self.calc_share <= 1.0:
            raise ValueError(f"CalcConfig.calc_share must be in [0, 1], got {self.calc_share}")


def _draw_steps(rng: random.Random, level: int) -> tuple[Step, ...]:
    if level == 2:
        a, b = rng.randint(1000, 9999), rng.randint(1000, 9999)
        if rng.random() < 0.5:
            return (Step(a, "add", b),)
        return (Step(max(a, b), "sub", min(a, b)),) if a != b else (Step(a, "add", b),)
    return (Step(rng.randint(100, 999), "mul", rng.randint(11, 99)),)


def draw_calc_problem(rng: random.Random, level: int) -> Problem:
    """Level 1: the bundled task's own draw; levels 2-3: large operands in the same wording."""
    if level == 1:
        return draw_problem(rng, 1)
    return word_problem(rng, level, _draw_steps(rng, level))


def expression(problem: Problem) -> str:
    """The calculator call that answers a one-step problem: `347 * 29`."""
    step = problem.steps[0]
    return f"{step.a} {SYMBOL[step.op]} {step.b}"


def tool_messages(problem: Problem) -> list[dict]:
    """A demonstration that calls the calculator (module doc); tool_calls as JSON text (the sources' layout)."""
    call = [{"type": "function", "function": {"name": TOOL_NAME, "arguments": {"expression": expression(problem)}}}]
    return [{"role": "user", "content": problem.question, "tool_calls": None},
            {"role": "assistant", "content": "", "tool_calls": json.dumps(call)},
            {"role": "tool", "content": f"<result>{problem.answer}</result>", "tool_calls": None},
            {"role": "assistant", "content": f"The answer is \\boxed{{{problem.answer}}}.", "tool_calls": None}]


def hand_messages(problem: Problem) -> list[dict]:
    return [{"role": "user", "content": problem.question, "tool_calls": None},
            {"role": "assistant", "content": render_solution(problem.steps), "tool_calls": None}]


def draw_calc_splits(cfg: CalcConfig) -> dict[str, list[Problem]]:
    """Eval first (unique keys, levels interleaved), then each training split from its own stream, eval keys banned."""
    eval_rng = random.Random(f"{cfg.seed}:calc_eval")
    levels = [lvl for lvl in LEVELS for _ in range(cfg.n_eval_per_level)]
    problems = unique_problems(eval_rng, levels, set(), set(), unique_keys=True, draw=draw_calc_problem)
    eval_rng.shuffle(problems)
    banned = {p.key for p in problems}
    splits = {"calc_eval": problems}
    for name, n, mix in (("calc_sft", cfg.n_sft, cfg.level_mix), ("calc_rl", cfg.n_rl, cfg.rl_level_mix)):
        rng = random.Random(f"{cfg.seed}:{name}")
        levels = rng.choices(LEVELS, weights=mix, k=n)
        splits[name] = unique_problems(rng, levels, banned, set(), draw=draw_calc_problem)
    return splits


def build_calc_tables(cfg: CalcConfig = CalcConfig()) -> dict[str, pa.Table]:
    splits = draw_calc_splits(cfg)
    tool_rng = random.Random(f"{cfg.seed}:tool-use")
    sft = []
    for i, p in enumerate(splits["calc_sft"]):
        tool = tool_rng.random() < cfg.calc_share
        sft.append(dict(id=f"csft-{i:05d}", level=p.level, key=p.key, tool_use=tool,
                        messages=tool_messages(p) if tool else hand_messages(p)))
    rows = {"calc_sft": sft,
            "calc_rl": [dict(id=f"crl-{i:05d}", level=p.level, key=p.key, prompt=p.question, answer=str(p.answer))
                        for i, p in enumerate(splits["calc_rl"])],
            "calc_eval": [dict(id=f"ceval-{i:05d}", level=p.level, key=p.key, prompt=p.question,
                               answer=str(p.answer), expression=expression(p))
                          for i, p in enumerate(splits["calc_eval"])]}
    return {name: pa.Table.from_pylist(rows[name], schema=SCHEMAS[name]) for name in SCHEMAS}


def write_calc(directory: str | Path, cfg: CalcConfig = CalcConfig()) -> dict[str, str]:
    """Write the calc_*.parquet files into `directory`; their sha256 by file name (GENERATED.json's `calc.files`)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for name, table in build_calc_tables(cfg).items():
        write_table(table, directory / f"{name}.parquet")
    return {f"{name}.parquet": sha256_file(directory / f"{name}.parquet") for name in SCHEMAS}
