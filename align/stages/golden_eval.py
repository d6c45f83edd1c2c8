"""align.stages.golden_eval: evaluate one rung's checkpoint on the held-out split (`golden_eval:<stage>`).

    python -m align.stages.golden_eval --config configs/tiny/golden_eval.toml stage=sft [table.key=value ...]

Loads `<runs>/<checkpoints[stage]>` (an HF checkpoint; its tokenizer must be the one the eval shards were built
with), checks that it survives a save -> load -> forward round trip bit for bit, then, through the inference
Engine: the golden decode (the first `[golden].prompts` eval prompts, greedy, on a fresh engine so nothing else
shares its batch or prefix cache), compared with the committed anchor (align.eval.golden); the greedy pass
(accuracy, format rate, mean length, truncation rate, judged by align.eval.verifier); the sampled pass (pass@k,
unbiased, from n samples per problem at [sampled].temperature, seeded per row and sample).

Publishes `<run_dir>/out/` (samples.jsonl: every judged response; golden.json: the golden decode; manifest last)
and `<run_dir>/metrics.json`, which the receipt carries: accuracy, pass_at_k, the golden verdict, the checkpoint's
content hash, the eval set's hash, and the outcome verdict (align.eval.outcome: the accuracy against the band
`[outcome.<rung>]` records for the profile). A golden mismatch is recorded, not raised: `doit smoke` fails on it.
`<runs>` is $ALIGN_RUNS_DIR under the pipeline, else runs/tiny; anchors are relative to $ALIGN_ROOT (else .)."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch

from align.config import load_cli_config, run_dir_from_env, write_resolved_config
from align.data.store import ShardSet
from align.eval.golden import GOLDEN_FILE, GoldenConfig, compare, golden_record, host_label, read_anchor
from align.eval.harness import GreedyConfig, SampledConfig, decode, judge, load_problems, verify_settings
from align.eval.metrics import greedy_metrics, sampled_metrics
from align.eval.outcome import OutcomeBand, check_rungs, describe, verdict
from align.model.roundtrip import RoundtripError, roundtrip
from align.exceptions import ConfigError
from align.exit_codes import exit_stage
from align.inference.config import EngineConfig, SamplingParams
from align.inference.engine import Engine
from align.inference.receipts import checkpoint_identity
from align.model.checkpoint import DTYPES, load_checkpoint, load_tokenizer
from align.profile import CommonConfig
from align.utils.dist import device
from align.utils.fsio import atomic_write_json, publish_dir, sha256_bytes, staging_dir
from align.utils.manifest import write_manifest

DEFAULT_CHECKPOINTS = {"sft": "sft_checkpoint/final", "dpo": "dpo_checkpoint/final", "grpo": "grpo_checkpoint/final"}


@dataclass(frozen=True)
class EvalDataConfig:
    """[data] table; paths relative to <runs>."""

    eval: str = "shards/eval/out"  # the held-out prompt shard set (prompts with gold answers)
    # the registered eval set (align.data.evalsets) those shards hold: its `verify` settings judge the answers;
    # "" (the profile's own held-out split): the RL reward's settings (align.eval.harness.verify_settings)
    evalset: str = ""
    dtype: Literal["float32", "bfloat16"] = "float32"  # weights as loaded for decoding (a 7B model: bfloat16)
    threads: int = 0  # torch CPU threads; 0: every core

    def __post_init__(self):
        try:
            verify_settings(self.evalset)
        except ConfigError as exc:  # as a ValueError, load_config names the file and the table
            raise ValueError(f"evalset = {self.evalset!r}: {exc}") from exc


@dataclass(frozen=True, kw_only=True)
class GoldenEvalStageConfig(CommonConfig):
    stage: str = ""  # the rung to evaluate, a key of [checkpoints]; the pipeline passes `stage=<variant>`
    checkpoints: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_CHECKPOINTS))
    data: EvalDataConfig = field(default_factory=EvalDataConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    greedy: GreedyConfig = field(default_factory=GreedyConfig)
    sampled: SampledConfig = field(default_factory=SampledConfig)
    golden: GoldenConfig = field(default_factory=GoldenConfig)
    outcome: dict[str, OutcomeBand] = field(default_factory=dict)  # rung -> recorded band (align.eval.outcome)

    def __post_init__(self):
        check_rungs(self.outcome, list(self.checkpoints))


def checkpoint_dir(cfg: GoldenEvalStageConfig, runs: Path) -> Path:
    if cfg.stage not in cfg.checkpoints:
        raise ConfigError(f"golden_eval: stage = {cfg.stage!r} is not a key of [checkpoints] "
                          f"(known: {', '.join(cfg.checkpoints) or 'none'})")
    return runs / cfg.checkpoints[cfg.stage]


def eval_set_hash(problems) -> str:
    """Content identity of the evaluated problems: ids, gold answers and prompt tokens, in order."""
    rows = [[p.id, p.gold, sha256_bytes(json.dumps(p.prompt_ids).encode())] for p in problems]
    return sha256_bytes(json.dumps(rows).encode())


def golden_pass(cfg: GoldenEvalStageConfig, model, tok, problems, ckpt_hash: str, root: Path) -> tuple[dict, dict]:
    """(golden.json record, receipt section). A fresh engine: the decode must not depend on earlier requests."""
    params = SamplingParams(temperature=0.0, max_new_tokens=cfg.golden.max_new_tokens)
    decoded = decode(Engine(model, cfg.engine, tok.vocab_size), tok, problems[: cfg.golden.prompts], params)
    samples = [{"id": d.problem.id, "prompt_sha256": sha256_bytes(json.dumps(d.problem.prompt_ids).encode()),
                "text": d.text, "tokens": len(d.token_ids)} for d in decoded]
    record = golden_record(cfg.stage, ckpt_hash, samples, host_label())
    if not cfg.golden.anchors:
        return record, {"status": "not_configured", "passed": False, "texts_sha256": record["texts_sha256"]}
    anchor_path = root / cfg.golden.anchors / f"{cfg.stage}.json"
    verdict = compare(record, read_anchor(anchor_path))
    return record, {**verdict, "anchor": f"{cfg.golden.anchors}/{cfg.stage}.json"}


def publish(out: Path, records: list[dict], golden: dict, inputs: dict) -> None:
    staging = staging_dir(out)
    with open(staging / "samples.jsonl", "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    (staging / GOLDEN_FILE).write_text(json.dumps(golden, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    write_manifest(staging, "golden_eval", inputs=inputs)
    publish_dir(staging, out)


def judged_passes(cfg: GoldenEvalStageConfig, model, tok, problems) -> tuple[dict, list[dict], float]:
    """The greedy and sampled passes on one engine: (metrics, samples.jsonl rows, decode tokens/s)."""
    engine = Engine(model, cfg.engine, tok.vocab_size)
    verify = verify_settings(cfg.data.evalset)
    greedy_set = problems[: cfg.greedy.max_examples or None]
    greedy = [judge(d, verify) for d in decode(engine, tok, greedy_set, SamplingParams(
        temperature=0.0, max_new_tokens=cfg.greedy.max_new_tokens))]
    sampled_set = problems[: cfg.sampled.max_examples or None]
    params = SamplingParams(temperature=cfg.sampled.temperature, max_new_tokens=cfg.sampled.max_new_tokens)
    sampled = [judge(d, verify) for d in decode(engine, tok, sampled_set, params, cfg.sampled.n, seed=cfg.run.seed)]
    metrics = {**greedy_metrics([j for j, _ in greedy]), **sampled_metrics([j for j, _ in sampled], cfg.sampled.ks),
               "eval_set_hash": eval_set_hash(greedy_set), "sampled_set_hash": eval_set_hash(sampled_set),
               "judged_with": cfg.data.evalset or "reward"}  # whose verifier settings: the eval set's or the reward's
    records = [{"pass": "greedy", **r} for _, r in greedy] + [{"pass": "sampled", **r} for _, r in sampled]
    # the golden texts are these kernels' rounding
    metrics.update(engine_linear_kernel=engine.linear_kernel, engine_cpu_kernels=engine.cpu_kernels)
    return metrics, records, engine.stats.generated_tokens / max(engine.stats.wall_s, 1e-9)


def load_verified(ckpt: Path, run_dir: Path, dtype: str):
    """(model, identity, round-trip report): the checkpoint, loaded and proven to survive save -> load."""
    model = load_checkpoint(ckpt, dtype=DTYPES[dtype], device=device())
    identity = checkpoint_identity(ckpt)
    rt = roundtrip(model, run_dir)
    if rt["content_hash"] != identity["content_hash"]:
        raise RoundtripError(f"{ckpt}: re-saved content hash {rt['content_hash'][:12]} differs from the "
                             f"published {identity['content_hash'][:12]}")
    return model, identity, rt


def summary(metrics: dict) -> str:
    k = ", ".join(f"pass@{k} {v:.3f}" for k, v in metrics["pass_at_k"].items())
    golden = metrics["golden"]
    line = (f"golden_eval:{metrics['stage']}: accuracy {metrics['accuracy']:.3f} on {metrics['examples']} ({k}); "
            f"format {metrics['format_rate']:.2f}, truncated {metrics['truncation_rate']:.2f}; "
            f"golden {golden['status']}; {describe(metrics['outcome'], metrics['stage'])}")
    if golden.get("first_diff"):
        line += (f"\ngolden: {golden['differing']} of {golden['prompts']} differ; first, "
                 f"{golden['first_diff']['id']}:\n{golden['first_diff']['diff']}")
    return line


def main() -> int:
    cfg = load_cli_config(GoldenEvalStageConfig, prog="align.stages.golden_eval")
    runs = Path(os.environ.get("ALIGN_RUNS_DIR", "runs/tiny"))
    root = Path(os.environ.get("ALIGN_ROOT", "."))
    run_dir = run_dir_from_env(runs / "golden_eval" / (cfg.stage or "unknown"))
    ckpt = checkpoint_dir(cfg, runs)
    torch.set_num_threads(cfg.data.threads or os.cpu_count() or 1)
    write_resolved_config(cfg, run_dir)
    t0 = time.perf_counter()
    tok = load_tokenizer(ckpt)
    shards = ShardSet.open(runs / cfg.data.eval, kind="prompts", tokenizer_hash=tok.content_hash)
    model, identity, rt = load_verified(ckpt, run_dir, cfg.data.dtype)
    limits = (cfg.greedy.max_examples, cfg.sampled.max_examples, cfg.golden.prompts)
    problems = load_problems(shards, 0 if 0 in limits else max(limits))
    golden, golden_section = golden_pass(cfg, model, tok, problems, identity["content_hash"], root)
    passes, records, rate = judged_passes(cfg, model, tok, problems)
    outcome = verdict(cfg.outcome.get(cfg.stage), passes["accuracy"], passes["accuracy_by_group"])
    metrics = {"stage": cfg.stage, **passes, "golden": golden_section, "outcome": outcome,
               "checkpoint_content_hash": identity["content_hash"], "num_parameters": identity["num_parameters"],
               "roundtrip": rt, "decode_tokens_per_s": round(rate, 1),
               "eval_wall_s": round(time.perf_counter() - t0, 2)}
    publish(run_dir / "out", records, golden, {"checkpoint": identity["content_hash"],
                                               "eval_set": metrics["eval_set_hash"]})
    atomic_write_json(run_dir / "metrics.json", metrics)
    print(summary(metrics), flush=True)
    return 0


if __name__ == "__main__":
    exit_stage(main)
