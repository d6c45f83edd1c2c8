"""Named held-out evaluation sets: where the problems and their gold answers come from, and how the verifier judges
answers to them.

    spec = get_evalset("math500")            # ConfigError listing the registered names on a typo
    ingest_evalset("math500", out_dir)       # -> prompts records (align.data.ingest_parquet), manifest with hash
    ingest_evalset("math500", out_dir, url="http://mirror/test.jsonl", max_rows=100)   # any SourceConfig field

| name       | source (published layout)                                           | gold                     |
|------------|---------------------------------------------------------------------|--------------------------|
| bundled    | data/raw/math_eval.parquet (this repo's held-out arithmetic task)   | `answer` column          |
| math500    | HuggingFaceH4/MATH-500 `test.jsonl` (problem, solution, answer, ...) | `answer` column          |
| math       | hendrycks MATH test split as JSONL (problem, level, type, solution)  | last `\\boxed{}`          |
| gsm8k_test | openai/gsm8k `main/test-*.parquet` (question, answer)                | after `####`             |

The hub URLs are the datasets' published files; none is fetched here (no network on the project's machines), so
their `sha256` is left unpinned: pin it in the override once a copy was checked. Verifier settings: MATH answers
are LaTeX and a model boxes them (`fallback` off: an unboxed answer is unreadable, as in the RL reward); GSM8K
golds are plain numbers and `percent = "either"` accepts 25 and 0.25 for 25%. Every set states its numeric-vs-exact
tolerance: `decimal_min_sig_digits = 4` (a decimal of a non-terminating exact gold, 1/3 or sqrt 10, counts when it has
>= 4 significant digits and is the gold rounded or truncated at its places; math_verify's counterpart is its 6-place
rounding); it is in the manifest's `verify` settings with the others."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from align.data.ingest_parquet import SourceConfig, ingest_source
from align.registry import Registry
from align.verify.config import VerifyConfig

HF = "https://huggingface.co/datasets"


@dataclass(frozen=True)
class EvalSet:
    name: str
    doc: str
    source: SourceConfig  # kind "prompts": the problems and their gold answers
    verify: VerifyConfig = field(default_factory=VerifyConfig)  # how answers to them are judged


EVALSETS: Registry = Registry("eval set")


def _register(spec: EvalSet) -> None:
    EVALSETS.register(spec.name)(lambda: spec)


_register(EvalSet("bundled", "the bundled arithmetic task's held-out split (data/README.md)",
                  SourceConfig(path="data/raw/math_eval.parquet", kind="prompts", format="prompt_answer",
                               id_column="id", group_column="level")))
_register(EvalSet("math500", "MATH-500 (Lightman et al.'s 500-problem MATH test subset)",
                  SourceConfig(url=f"{HF}/HuggingFaceH4/MATH-500/resolve/main/test.jsonl", kind="prompts",
                               format="math", id_column="unique_id", group_column="level", max_reject_fraction=0.0)))
_register(EvalSet("math", "MATH test split (Hendrycks et al.), one JSONL line per problem",
                  SourceConfig(path="data/external/math_test.jsonl", kind="prompts", format="math",
                               group_column="type", max_reject_fraction=0.0)))
_register(EvalSet("gsm8k_test", "GSM8K test split (1,319 problems)",
                  SourceConfig(url=f"{HF}/openai/gsm8k/resolve/main/main/test-00000-of-00001.parquet",
                               kind="prompts", format="gsm8k", max_reject_fraction=0.0),
                  VerifyConfig(percent="either", decimal_min_sig_digits=4)))


def get_evalset(name: str) -> EvalSet:
    return EVALSETS.get(name)()


def ingest_evalset(name: str, out_dir: str | Path, base_dir: str | Path = ".", **source_overrides) -> dict:
    """Ingest a registered eval set into `out_dir` (published atomically); overrides replace SourceConfig fields
    (a `path` override clears the registered `url` and the reverse). Returns the manifest, with the set's name and
    verifier settings added for whoever evaluates on it."""
    spec = get_evalset(name)
    if "path" in source_overrides:
        source_overrides.setdefault("url", "")
    if "url" in source_overrides:
        source_overrides.setdefault("path", "")
    source = dataclasses.replace(spec.source, **source_overrides)
    manifest = ingest_source(name, source, out_dir, base_dir=base_dir)
    return {**manifest, "evalset": name, "verify": dataclasses.asdict(spec.verify)}
