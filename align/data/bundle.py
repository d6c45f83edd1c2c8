"""The embedded default data: the bundled math task split into SFT, preference pairs, RL prompts, the reward model's
pair prompts and held-out eval, written as parquet under `data/raw/` byte-identically from a seed.

Held-out discipline: the eval problems are drawn first and their arithmetic keys (see `mathtask.Problem.key`) are
excluded from every training split, so no eval problem is seen in training, not even reworded. Within a split no
question text repeats (ingest would de-duplicate it anyway).

Byte identity: rows are built in a seeded order and written with fixed writer options (`WRITE_OPTIONS`); parquet
records the writer's version (`created_by`), so identical bytes need the same pyarrow version, which
`data/raw/GENERATED.json` records beside the files' hashes."""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pyarrow as pa
import pyarrow.parquet as pq

from align.config import to_dict
from align.utils.fsio import atomic_write_json, sha256_file
from align.data.mathtask import LEVELS, WRONG_KINDS, Problem, draw_problem, render_solution, wrong_solution

MESSAGE = pa.struct([("role", pa.string()), ("content", pa.string())])
SCHEMAS = {
    "math_sft": pa.schema([("id", pa.string()), ("level", pa.int8()), ("key", pa.string()),
                           ("messages", pa.list_(MESSAGE))]),
    "math_pairs": pa.schema([("id", pa.string()), ("level", pa.int8()), ("key", pa.string()),
                             ("prompt", pa.string()), ("chosen", pa.string()), ("rejected", pa.string()),
                             ("error_kind", pa.string())]),
    "math_rl": pa.schema([("id", pa.string()), ("level", pa.int8()), ("key", pa.string()),
                          ("prompt", pa.string()), ("answer", pa.string())]),
    "math_rm_pairs": pa.schema([("id", pa.string()), ("level", pa.int8()), ("key", pa.string()),
                                ("prompt", pa.string()), ("chosen", pa.string()), ("rejected", pa.string()),
                                ("error_kind", pa.string())]),
    "math_eval": pa.schema([("id", pa.string()), ("level", pa.int8()), ("key", pa.string()),
                            ("prompt", pa.string()), ("answer", pa.string()), ("solution", pa.string())]),
}
# NOTE: every option that changes bytes is pinned here; pyarrow's defaults have changed between releases.
WRITE_OPTIONS = dict(compression="zstd", compression_level=9, use_dictionary=True, write_statistics=False,
                     version="2.6", data_page_version="1.0", row_group_size=4096, store_schema=True)


@dataclass(frozen=True)
class BundleConfig:
    """Sizes and mixture of the bundled task. `level_mix` weights levels 1-4 in the SFT and pair splits, `rl_level_mix`
    in the RL prompts: RL spends its samples where the SFT policy is right only sometimes (levels 3 and 4)."""

    seed: int = 20261130
    n_sft: int = 6000
    n_pairs: int = 1500
    # RL prompts: enough that GRPO's 360 steps (~7,800 prompts drawn with the top-ups) see each ~1.3 times. On 1,000
    # repeated prompts GRPO raised those prompts by 14 points and the held-out ones by ~2; on 6,000 fresh ones the
    # held-out gain grew with the steps (docs/MEASUREMENTS.md, ladder, 2026-12-04)
    n_rl: int = 6000
    # The reward model's own pair prompts (the rm_prompts -> rm_pairs -> rm_shards rungs): drawn after the other
    # splits from their own streams, so adding them changed no other file; no question text of math_pairs (or of
    # the eval split) recurs here, so the DPO split's held-out pairs stay unseen by a reward model trained on these.
    n_rm_pairs: int = 6000
    n_eval_per_level: int = 150  # 600 held-out problems: a +5-point gain is several standard errors
    level_mix: tuple[float, ...] = (0.3, 0.25, 0.25, 0.2)
    rl_level_mix: tuple[float, ...] = (0.1, 0.2, 0.3, 0.4)
    wrong_kinds: tuple[str, ...] = field(default=WRONG_KINDS)

    def __post_init__(self):
        for name in ("level_mix", "rl_level_mix"):
            if len(getattr(self, name)) != len(LEVELS):
                raise ValueError(f"BundleConfig.{name}: one weight per level {LEVELS}, got {getattr(self, name)}")


def unique_problems(rng: random.Random, levels: list[int], banned_keys: set[str], seen_text: set[str],
                    unique_keys: bool = False, draw: Callable[[random.Random, int], Problem] = draw_problem
                    ) -> list[Problem]:
    """Draw one problem per requested level with `draw` (the bundled task's, or another task's such as
    align.data.calctask's), skipping banned keys and repeated question texts."""
    out: list[Problem] = []
    keys: set[str] = set()
    for level in levels:
        for _attempt in range(10_000):
            p = draw(rng, level)
            if p.key in banned_keys or p.question in seen_text or (unique_keys and p.key in keys):
                continue
            seen_text.add(p.question)
            keys.add(p.key)
            out.append(p)
            break
        else:
            raise RuntimeError(f"level {level}: could not draw a fresh problem; the key space is exhausted")
    return out


def _levels(rng: random.Random, n: int, mix: tuple[float, ...]) -> list[int]:
    return rng.choices(LEVELS, weights=mix, k=n)


def draw_splits(cfg: BundleConfig) -> dict[str, list[Problem]]:
    """Problems of each split. Each split has its own RNG stream, so resizing one split leaves the others intact."""
    eval_levels = [lvl for lvl in LEVELS for _ in range(cfg.n_eval_per_level)]
    eval_rng = random.Random(f"{cfg.seed}:eval")
    eval_problems = unique_problems(eval_rng, eval_levels, set(), set(), unique_keys=True)
    eval_rng.shuffle(eval_problems)  # levels interleaved: any prefix (a smoke profile's cut) mixes them
    banned = {p.key for p in eval_problems}
    splits = {"math_eval": eval_problems}
    for name, n, mix in (("math_sft", cfg.n_sft, cfg.level_mix), ("math_pairs", cfg.n_pairs, cfg.level_mix),
                         ("math_rl", cfg.n_rl, cfg.rl_level_mix)):
        rng = random.Random(f"{cfg.seed}:{name}")
        splits[name] = unique_problems(rng, _levels(rng, n, mix), banned, set())
    rng = random.Random(f"{cfg.seed}:math_rm_pairs")
    # an eval text can recur under another level's key (`16 - 6` is a level-1 and a level-2 problem): ban the texts too
    seen = {p.question for p in splits["math_pairs"]} | {p.question for p in eval_problems}
    splits["math_rm_pairs"] = unique_problems(rng, _levels(rng, cfg.n_rm_pairs, cfg.level_mix), banned, seen)
    return splits


def _pair_row(rng: random.Random, i: int, p: Problem, kinds: tuple[str, ...], prefix: str = "pair") -> dict:
    for _attempt in range(100):
        kind = rng.choice(kinds)
        rejected = wrong_solution(rng, p, kind)
        if rejected is not None:
            return dict(id=f"{prefix}-{i:05d}", level=p.level, key=p.key, prompt=p.question,
                        chosen=render_solution(p.steps), rejected=rejected, error_kind=kind)
    raise RuntimeError(f"problem {p.key}: no wrong solution after 100 draws")


def build_tables(cfg: BundleConfig = BundleConfig()) -> dict[str, pa.Table]:
    """The tables of the bundle, keyed by file stem."""
    splits = draw_splits(cfg)
    rows: dict[str, list[dict]] = {
        "math_sft": [dict(id=f"sft-{i:05d}", level=p.level, key=p.key,
                          messages=[{"role": "user", "content": p.question},
                                    {"role": "assistant", "content": render_solution(p.steps)}])
                     for i, p in enumerate(splits["math_sft"])],
        "math_rl": [dict(id=f"rl-{i:05d}", level=p.level, key=p.key, prompt=p.question, answer=str(p.answer))
                    for i, p in enumerate(splits["math_rl"])],
        "math_eval": [dict(id=f"eval-{i:05d}", level=p.level, key=p.key, prompt=p.question,
                           answer=str(p.answer), solution=render_solution(p.steps))
                      for i, p in enumerate(splits["math_eval"])],
    }
    pair_rng = random.Random(f"{cfg.seed}:pair-errors")
    rows["math_pairs"] = [_pair_row(pair_rng, i, p, cfg.wrong_kinds) for i, p in enumerate(splits["math_pairs"])]
    rm_rng = random.Random(f"{cfg.seed}:rm-pair-errors")
    rows["math_rm_pairs"] = [_pair_row(rm_rng, i, p, cfg.wrong_kinds, "rmpair")
                             for i, p in enumerate(splits["math_rm_pairs"])]
    return {name: pa.Table.from_pylist(rows[name], schema=SCHEMAS[name]) for name in SCHEMAS}


def write_table(table: pa.Table, path: str | Path) -> None:
    """Write with the pinned options, staged and renamed so a reader never sees a half-written file."""
    staged = Path(path).with_name(f".{Path(path).name}.tmp")
    pq.write_table(table, str(staged), **WRITE_OPTIONS)
    os.replace(staged, path)


def generated_record(directory: str | Path) -> dict:
    """What `GENERATED.json` says: the writer's pyarrow version and the sha256 of every bundle file."""
    directory = Path(directory)
    return {"pyarrow": pa.__version__,
            "files": {f"{name}.parquet": sha256_file(directory / f"{name}.parquet") for name in SCHEMAS
                      if (directory / f"{name}.parquet").is_file()}}


def write_bundle(directory: str | Path, cfg: BundleConfig = BundleConfig()) -> dict:
    """Write the parquet files and `GENERATED.json` (their hashes and the pyarrow version) into `directory`."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for name, table in build_tables(cfg).items():
        write_table(table, directory / f"{name}.parquet")
    record = {**generated_record(directory), "config": to_dict(cfg)}
    atomic_write_json(directory / "GENERATED.json", record)
    return record
