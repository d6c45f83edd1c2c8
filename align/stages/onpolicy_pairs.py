"""align.stages.onpolicy_pairs: preference pairs from the policy's own samples (`onpolicy_pairs`).

    python -m align.stages.onpolicy_pairs --config configs/tiny/onpolicy_pairs.toml

Reads a pairs records artifact (`[data].source`, e.g. `ingest/math_pairs/out`) and the policy checkpoint
(`[data].policy`, the SFT checkpoint). For every pair's prompt it samples `[pairs].samples` responses through the
inference Engine (seeded per row and sample: the result does not depend on batching), judges each against the gold
answer (the last `\\boxed{}` of the pair's chosen response; a chosen response without one is refused by row and id)
with the verifier and, by default, the arithmetic step check, and keeps one pair per prompt (align.data.onpolicy).

Publishes `<run_dir>/out/` as a records artifact of kind "pairs" (what `shards:<split>` reads when `[splits]` names
`onpolicy_pairs/out`): records.parquet, samples.jsonl (every judged sample, for tracing a pair to its samples), the
manifest last, with the policy's content hash and the source's digest as inputs. `<run_dir>/metrics.json`: the
policy's sample accuracy and where the pairs came from. `<runs>` is $ALIGN_RUNS_DIR under the pipeline, else
runs/tiny."""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pyarrow as pa
import pyarrow.parquet as pq
import torch

from align.config import load_cli_config, run_dir_from_env, write_resolved_config
from align.data.encoding import DEFAULT_DATE_STRING
from align.data.ingest_parquet import MANIFEST_KIND, RECORDS, WRITE_OPTIONS
from align.data.onpolicy import JudgedSample, OnPolicyConfig, choose_pair, summarise
from align.data.schema import NORMALISED, PreferencePair, from_row, messages_plain, to_row, validate
from align.eval.harness import Problem, decode
from align.exceptions import DataError
from align.exit_codes import exit_stage
from align.inference.config import EngineConfig, SamplingParams
from align.inference.engine import Engine
from align.inference.receipts import checkpoint_identity
from align.model.checkpoint import DTYPES, load_checkpoint, load_tokenizer
from align.profile import CommonConfig
from align.rl.rewards import CompositeReward, RewardConfig
from align.utils.dist import device
from align.utils.fsio import atomic_write_json, publish_dir, staging_dir
from align.utils.manifest import manifest_digest, read_manifest, write_manifest
from align.verify import DEFAULT_CONFIG, extract

@dataclass(frozen=True)
class OnPolicyDataConfig:
    """[data] table; paths relative to <runs>."""

    policy: str = "sft_checkpoint/final"  # the checkpoint whose samples become the pairs
    source: str = "ingest/math_pairs/out"  # a records artifact of kind "pairs": prompts, gold (from chosen), fallback
    dtype: Literal["float32", "bfloat16"] = "float32"
    threads: int = 1  # torch CPU threads; 0: every core (decoding is many small ops: one thread, see eval)


@dataclass(frozen=True, kw_only=True)
class OnPolicyStageConfig(CommonConfig):
    data: OnPolicyDataConfig = field(default_factory=OnPolicyDataConfig)
    pairs: OnPolicyConfig = field(default_factory=OnPolicyConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)


def read_pairs(source: Path, limit: int = 0) -> list[PreferencePair]:
    """The pair records of a records artifact (manifest checked), the first `limit` (0: all)."""
    manifest = read_manifest(source, kind=MANIFEST_KIND)
    if manifest.get("record_kind") != "pairs":
        raise DataError(f"{source}: onpolicy_pairs needs a records artifact of kind 'pairs', this one holds "
                        f"{manifest.get('record_kind')!r}")
    rows = pq.read_table(source / RECORDS).to_pylist()
    return [from_row("pairs", row) for row in rows[: limit or None]]


def problems_of(pairs: list[PreferencePair], tok, source: Path) -> list[Problem]:
    """Prompt ids and gold answers; the gold is the last box of the chosen response."""
    out = []
    for row, pair in enumerate(pairs):
        gold = extract(pair.chosen, DEFAULT_CONFIG.max_response_chars).answer
        if gold is None:
            raise DataError(f"{source / RECORDS}: row {row} (id {pair.id!r}): the chosen response has no \\boxed{{}} "
                            f"answer; on-policy pairs need a verifiable gold answer in every chosen response")
        # the tokenizer directory's own chat format, the date pinned as the shards pin it (align.data.encoding)
        ids = tok.encode_prompt(messages_plain(pair.prompt), date_string=DEFAULT_DATE_STRING)
        out.append(Problem(row, pair.id, pair.group, gold, tuple(ids)))
    return out


def sample_and_judge(engine: Engine, tok, problems: list[Problem], cfg: OnPolicyConfig,
                     seed: int) -> tuple[list[list[JudgedSample]], list[dict]]:
    """Per problem its judged samples (sample order), and the samples.jsonl rows."""
    params = SamplingParams(temperature=cfg.temperature, top_p=cfg.top_p, max_new_tokens=cfg.max_new_tokens)
    reward = CompositeReward(RewardConfig(step_check=cfg.step_check), cfg.max_new_tokens)
    judged: list[list[JudgedSample]] = [[] for _ in problems]
    rows = []
    for d in decode(engine, tok, problems, params, cfg.samples, seed=seed):
        r = reward(d.text, d.problem.gold, len(d.token_ids), d.finish_reason)
        judged[d.problem.row].append(JudgedSample(d.text, r.correct, d.finish_reason == "stop", d.model_logprob))
        rows.append({"row": d.problem.row, "id": d.problem.id, "sample": d.sample, "gold": d.problem.gold,
                     "response": d.text, "status": r.status, "correct": r.correct, "tokens": len(d.token_ids),
                     "finish_reason": d.finish_reason, "model_logprob": round(d.model_logprob, 6)})
    return judged, rows


def publish(out: Path, pairs: list[PreferencePair], sample_rows: list[dict], inputs: dict, extra: dict) -> dict:
    staging = staging_dir(out)
    try:
        table = pa.Table.from_pylist([to_row(validate(p)) for p in pairs], schema=NORMALISED["pairs"])
        pq.write_table(table, str(staging / RECORDS), **WRITE_OPTIONS)
        with open(staging / "samples.jsonl", "w", encoding="utf-8") as f:
            for r in sample_rows:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
        manifest = write_manifest(staging, MANIFEST_KIND, inputs=inputs, extra=extra)
        publish_dir(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)  # nothing half-written survives a failure
        raise
    return manifest


def _share(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def line(m: dict) -> str:
    return (f"onpolicy_pairs: {m['pairs']} pairs ({m['pairs_onpolicy']} on-policy, {m['pairs_offline']} kept from "
            f"the source, {m['dropped']} dropped) from {m['samples']} samples of {m['prompts']} prompts; sample "
            f"accuracy {_share(m['sample_accuracy'])}; the policy prefers the rejected arm of "
            f"{_share(m['policy_prefers_rejected'])} of the fully on-policy pairs ({m['wall_s']:.0f} s)")


def main() -> int:
    cfg = load_cli_config(OnPolicyStageConfig, prog="align.stages.onpolicy_pairs")
    runs = Path(os.environ.get("ALIGN_RUNS_DIR", "runs/tiny"))
    run_dir = run_dir_from_env(runs / "onpolicy_pairs")
    torch.set_num_threads(cfg.data.threads or os.cpu_count() or 1)
    write_resolved_config(cfg, run_dir)
    t0 = time.perf_counter()
    source, policy = runs / cfg.data.source, runs / cfg.data.policy
    pairs = read_pairs(source, cfg.pairs.max_prompts)
    tok = load_tokenizer(policy)
    problems = problems_of(pairs, tok, source)
    model = load_checkpoint(policy, dtype=DTYPES[cfg.data.dtype], device=device())
    engine = Engine(model, cfg.engine, tok.vocab_size)
    judged, sample_rows = sample_and_judge(engine, tok, problems, cfg.pairs, cfg.run.seed)
    choices = [choose_pair(p, s, cfg.pairs) for p, s in zip(pairs, judged)]
    metrics = summarise(choices, [s for group in judged for s in group])
    identity = checkpoint_identity(policy)
    inputs = {"policy": identity["content_hash"], "source": manifest_digest(source)}
    publish(run_dir / "out", [c.pair for c in choices if c.pair is not None], sample_rows, inputs, {
        "source": "onpolicy_pairs", "record_kind": "pairs", "format": "onpolicy", "rows_in": len(pairs),
        "rows_out": metrics["pairs"], "duplicates": 0, "rejected": 0, "rejections": [], "sampling": metrics})
    metrics.update({"policy_content_hash": identity["content_hash"], "engine_linear_kernel": engine.linear_kernel,
                    "engine_cpu_kernels": engine.cpu_kernels,
                    "decode_tokens_per_s": round(engine.stats.generated_tokens / max(engine.stats.wall_s, 1e-9), 1),
                    "wall_s": round(time.perf_counter() - t0, 2)})
    atomic_write_json(run_dir / "metrics.json", metrics)
    print(line(metrics), flush=True)
    return 0


if __name__ == "__main__":
    exit_stage(main)
