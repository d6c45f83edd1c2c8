"""The evaluation harness: held-out prompts through the inference Engine, responses judged by the verifier.

Two passes over the eval split (a prompt shard set: prompt ids ending after `[/INST]`, gold answer beside them):
greedy (one response per problem: accuracy, format, length, truncation) and sampled (n responses per problem at
a temperature, each with its own seed derived from the run seed, the row and the sample index, so a sample does
not depend on what else is in the batch: pass@k). Decoding stops at the tokenizer's end-of-sequence token.

Answers are judged with the evaluation set's own verifier settings (`verify_settings`: what a registered eval set of
align.data.evalsets declares, GSM8K's "25 or 0.25 for 25%" and every set's numeric-vs-exact tolerance), the RL
reward's (REWARD_CONFIG) only for a split that names no registered set."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from align.data.evalsets import get_evalset
from align.data.store import ShardSet
from align.eval.metrics import Judged
from align.eval.verifier import score
from align.inference.config import SamplingParams
from align.inference.engine import Engine
from align.inference.sequence import GenerationRequest, derive_seed
from align.verify.config import REWARD_CONFIG, VerifyConfig


@dataclass(frozen=True)
class GreedyConfig:
    """[greedy] table: the accuracy pass."""

    max_new_tokens: int = 64  # the bundled task's answers take ~30 tokens; a cut answer counts as truncated
    max_examples: int = 0  # the first N eval rows; 0 = every row


@dataclass(frozen=True)
class SampledConfig:
    """[sampled] table: the pass@k pass (unbiased estimator from n samples per problem)."""

    n: int = 8  # samples per problem
    ks: tuple[int, ...] = (1, 4)  # each k <= n is reported as metrics.pass_at_k["k"]
    temperature: float = 1.0
    max_new_tokens: int = 64
    max_examples: int = 0  # the first N eval rows; 0 = every row

    def __post_init__(self):
        if self.n < 1 or any(not 1 <= k <= self.n for k in self.ks):
            raise ValueError(f"sampled: need n >= 1 and every k in [1, n]; got n={self.n}, ks={list(self.ks)}")


@dataclass(frozen=True)
class Problem:
    row: int
    id: str
    group: str
    gold: str
    prompt_ids: tuple[int, ...]


@dataclass(frozen=True)
class Decoded:
    problem: Problem
    sample: int  # 0 for greedy; 0..n-1 for sampled
    token_ids: tuple[int, ...]  # generated tokens, the stop token included when one ended the response
    text: str  # decoded response, special tokens dropped
    finish_reason: str
    model_logprob: float  # sum of the untempered model's log-probs of token_ids


def load_problems(shards: ShardSet, limit: int = 0) -> list[Problem]:
    """The first `limit` rows (0: all) of a prompt shard set, in row order."""
    if shards.kind != "prompts":
        raise ValueError(f"{shards.path}: eval needs a prompt shard set, this one holds {shards.kind!r} rows")
    count = len(shards) if limit <= 0 else min(limit, len(shards))
    problems = []
    for row in range(count):
        meta = shards.meta(row)
        ids, _mask = shards.sequence(row)
        problems.append(Problem(row, meta["id"], meta["group"] or "", meta["gold"] or "", tuple(int(t) for t in ids)))
    return problems


def decode(engine: Engine, tokenizer, problems: Sequence[Problem], params: SamplingParams, samples: int = 1,
           seed: int = 0) -> list[Decoded]:
    """`samples` responses per problem, problem-major. Greedy ignores the seeds."""
    stop = (tokenizer.eos_id,) if tokenizer.eos_id is not None else ()
    params = SamplingParams(temperature=params.temperature, top_k=params.top_k, top_p=params.top_p,
                            max_new_tokens=params.max_new_tokens, stop_token_ids=stop)
    requests = [GenerationRequest(p.prompt_ids, params, seed=derive_seed(seed, p.row, j), request_id=(i, j))
                for i, p in enumerate(problems) for j in range(samples)]
    out = []
    for req, res in zip(requests, engine.generate(requests)):
        if res.finish_reason == "error":
            raise RuntimeError(f"eval row {problems[req.request_id[0]].row}: the engine refused it: {res.error}")
        problem = problems[req.request_id[0]]
        text = tokenizer.decode(res.token_ids, skip_special_tokens=True)
        out.append(Decoded(problem, req.request_id[1], tuple(res.token_ids), text, res.finish_reason,
                           float(sum(res.model_logprobs))))
    return out


def verify_settings(evalset: str) -> VerifyConfig:
    """How answers on eval set `evalset` are judged: the settings its registration declares (align.data.evalsets;
    an unknown name is a ConfigError listing the registered ones); "" (a split of the profile's own data, no
    registered set): the RL reward's, so a bundled-task eval judges as its GRPO reward does."""
    return get_evalset(evalset).verify if evalset else REWARD_CONFIG


def judge(decoded: Decoded, verify: VerifyConfig) -> tuple[Judged, dict]:
    """The verifier's verdict under the eval set's settings (`verify_settings`) as a metrics record, and the JSON
    row written to samples.jsonl. No default: a caller that forgets the set's settings would judge with the
    reward's."""
    verdict = score(decoded.text, decoded.problem.gold, verify)
    p = decoded.problem
    judged = Judged(p.row, p.group, verdict.reward, verdict.format_ok, len(decoded.token_ids),
                    decoded.finish_reason == "length")
    record = {"row": p.row, "id": p.id, "group": p.group, "sample": decoded.sample, "gold": p.gold,
              "response": decoded.text, "extracted": verdict.extracted, "reward": verdict.reward,
              "status": verdict.status, "format_ok": verdict.format_ok, "tokens": len(decoded.token_ids),
              "finish_reason": decoded.finish_reason}
    return judged, record
