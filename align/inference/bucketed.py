"""Batched scoring of given completions: the summed log-prob of each completion after its prompt, and its length.

Used by the DPO reference cache and by evaluation. Rows are sorted by length and batched, each batch padded on the
right to a multiple of `bucket` tokens so the number of distinct shapes stays small (compile / graph friendly) and
short rows are not padded to the longest row of the whole set. Right padding needs no attention mask: a real token
never attends to the padding after it, so the causal fast path is exact. Logits are formed only at completion
positions, in row chunks, so the (B, T, V) tensor never exists.

A row's result does not depend on the rows it is batched with beyond float summation order (GEMM blocking)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F

LOGIT_CHUNK_ROWS = 1024


@dataclass(frozen=True)
class ScoreResult:
    logprob_sums: torch.Tensor  # (N,) float32: sum over completion tokens of log p(token | prefix)
    token_counts: torch.Tensor  # (N,) int64: completion lengths
    token_logprobs: list[torch.Tensor] | None = None  # per row (len_i,) float32, when asked for


@torch.inference_mode()
def score_completions(model: torch.nn.Module, prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]],
                      *, batch_size: int = 8, bucket: int = 32, pad_id: int = 0,
                      return_token_logprobs: bool = False) -> ScoreResult:
    """Score completions[i] after prompts[i] under `model` (an align MistralForCausalLM), in its dtype; log-softmax
    in fp32. An empty completion scores 0 with count 0; an empty prompt is an error (nothing predicts token 0)."""
    if len(prompts) != len(completions):
        raise ValueError(f"score_completions: {len(prompts)} prompts but {len(completions)} completions")
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise ValueError(f"score_completions: row {i} has an empty prompt")
    if batch_size < 1 or bucket < 1:
        raise ValueError(f"score_completions: batch_size and bucket must be >= 1, got {batch_size}, {bucket}")
    n = len(prompts)
    sums = torch.zeros(n, dtype=torch.float32)
    counts = torch.tensor([len(c) for c in completions], dtype=torch.int64)
    per_token: list[torch.Tensor | None] = [None] * n
    order = sorted(range(n), key=lambda i: -(len(prompts[i]) + len(completions[i])))
    for lo in range(0, n, batch_size):
        rows = order[lo:lo + batch_size]
        token_lps = _score_batch(model, [prompts[i] for i in rows], [completions[i] for i in rows], bucket, pad_id)
        for i, lp in zip(rows, token_lps):
            sums[i] = lp.sum()
            per_token[i] = lp
    return ScoreResult(sums, counts, per_token if return_token_logprobs else None)


def _score_batch(model, prompts, completions, bucket: int, pad_id: int) -> list[torch.Tensor]:
    lengths = [len(p) + len(c) for p, c in zip(prompts, completions)]
    T = -(-max(lengths) // bucket) * bucket
    device = model.lm_head.weight.device
    ids = torch.full((len(prompts), T), pad_id, dtype=torch.int64)
    flat_pred, targets, splits = [], [], []
    for r, (p, c) in enumerate(zip(prompts, completions)):
        ids[r, :len(p) + len(c)] = torch.tensor(list(p) + list(c), dtype=torch.int64)
        start = r * T + len(p) - 1  # the hidden state at position t predicts token t + 1
        flat_pred.extend(range(start, start + len(c)))
        targets.extend(c)
        splits.append(len(c))
    hidden = model.forward_hidden(ids.to(device))  # (B, T, D); right padding: causal mask suffices
    hidden = hidden.flatten(0, 1)[torch.tensor(flat_pred, dtype=torch.int64, device=device)]  # (M, D)
    target = torch.tensor(targets, dtype=torch.int64, device=device)
    out = torch.empty(len(targets), dtype=torch.float32)
    weight = model.lm_head.weight
    for lo in range(0, len(targets), LOGIT_CHUNK_ROWS):
        logits = F.linear(hidden[lo:lo + LOGIT_CHUNK_ROWS], weight).float()  # (rows, V), as lm_head
        lp = logits.log_softmax(-1).gather(1, target[lo:lo + LOGIT_CHUNK_ROWS, None]).squeeze(1)
        out[lo:lo + LOGIT_CHUNK_ROWS] = lp.cpu()
    return list(out.split(splits))
