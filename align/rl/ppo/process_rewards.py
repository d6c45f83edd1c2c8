"""PPO's per-token process rewards from a process reward model ([reward] process_model: a MistralForProcessReward
trained by align.reward.rm_process on step-labelled solutions, e.g. align.reward.step_labels' rule-labelled ones).

A step is a line of the completion (the bundled task writes one step per line, and rm_process encodes a solution as
its steps joined by newlines). Completion token k ends a step when it is step text (not a newline token, not EOS)
and the next token starts a new line, or it is the completion's last text token: the position where rm_process
puts a step's label (the token before the newline; the reply's last text token, not `</s>`). There the reward is
the PRM's centred belief that the step is right,
    r_k = weight * (2 * sigmoid(logit_k) - 1)          in (-weight, +weight)
and 0 on every other token; PpoBatchSource adds it to the outcome and KL rewards (align.rl.ppo.rewards) before GAE,
so a false step is charged where it was written instead of only at the end. Centred so that a PRM that cannot tell
(p = 0.5) adds nothing, and a confident "right" is worth as much as a confident "wrong" costs; a PRM's rewards
still grow with the number of steps (a known bias of dense step rewards: a short solution of right steps earns less
than a long one)."""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn


NEWLINE_SPELLINGS = ("\n", "<0x0A>", "\u010a")  # a newline in a vocabulary: literal, byte fallback, byte-level BPE


def newline_token_ids(tok) -> torch.Tensor:
    """(V,) bool: the tokens whose text starts a new line. Decoding all 32k tokens one by one takes seconds, so
    only tokens whose vocabulary entry spells a newline are decoded (and kept when their text starts with one)."""
    out = torch.zeros(tok.vocab_size, dtype=torch.bool)
    for i in range(tok.vocab_size):
        raw = tok.id_to_token(i) or ""
        if any(s in raw for s in NEWLINE_SPELLINGS):
            out[i] = tok.decode([i]).startswith("\n")
    return out


def step_ends(completion_ids: torch.Tensor, mask: torch.Tensor, newline: torch.Tensor, eos_id: int) -> torch.Tensor:
    """(N, C) bool: the last token of every step (module doc) of each completion; mask (N, C) marks real tokens."""
    m = mask.bool()
    ids = completion_ids.clamp(0, newline.shape[0] - 1)
    is_nl = newline[ids] & m
    text = m & ~is_nl & (completion_ids != eos_id)
    next_nl = torch.zeros_like(m)
    next_nl[:, :-1] = is_nl[:, 1:]
    positions = torch.arange(m.shape[1]).expand_as(m)
    last_text = torch.where(text, positions, -1).max(dim=1).values  # -1: no text token
    return text & (next_nl | (positions == last_text[:, None]))


def _check_prm(model: nn.Module) -> None:
    model.eval().requires_grad_(False)
    if model.score.out_features != 1:
        raise ValueError(f"a process reward model has one logit per token (num_labels 1), this one has "
                         f"{model.score.out_features}")


def step_beliefs(model: nn.Module, batch: dict, newline: torch.Tensor, eos_id: int
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """(belief (N, C) = 2 sigmoid(logit) - 1 at each completion token, step ends (N, C) bool) of a frozen PRM."""
    dev = model.score.weight.device
    ids, start, comp = batch["input_ids"], batch["completion_start"], batch["completion_ids"]
    mask = batch["completion_mask"]
    ends = start + mask.sum(1).long()
    attention = torch.arange(ids.shape[1])[None, :] < ends[:, None]
    logits = model(ids.to(dev), attention.to(dev))[..., 0].float().cpu()  # (N, T): after reading token t
    pos = (start[:, None] + torch.arange(comp.shape[1])[None, :]).clamp(max=ids.shape[1] - 1)
    belief = 2.0 * torch.sigmoid(logits.gather(1, pos)) - 1.0  # (N, C) at each completion token
    return belief, step_ends(comp, mask, newline, eos_id)


def process_reward_scorer(model: nn.Module, newline: torch.Tensor, eos_id: int,
                          weight: float = 1.0) -> Callable[[dict], torch.Tensor]:
    """A frozen PRM -> micro-batch (align.rl.types layout) -> (N, C) fp32 process rewards (module doc)."""
    _check_prm(model)

    @torch.no_grad()
    def scorer(batch: dict) -> torch.Tensor:
        belief, ends = step_beliefs(model, batch, newline, eos_id)
        return torch.where(ends, weight * belief, torch.zeros_like(belief))

    return scorer


def process_sequence_scorer(model: nn.Module, newline: torch.Tensor, eos_id: int,
                            aggregate: str = "min") -> Callable[[dict], torch.Tensor]:
    """A frozen PRM -> micro-batch -> (N,) one score per completion: its step beliefs aggregated ("min": the
    weakest step, "mean", "last": the final step's); 0 for a completion with no step. GRPO's (and PPO's)
    `process_reward_model` term (align.rl.reward_terms): a sequence reward, where `[reward] process_model` gives
    PPO the same beliefs per token."""
    _check_prm(model)

    @torch.no_grad()
    def scorer(batch: dict) -> torch.Tensor:
        belief, ends = step_beliefs(model, batch, newline, eos_id)
        n = ends.sum(1)
        if aggregate == "min":
            out = torch.where(ends, belief, torch.full_like(belief, float("inf"))).min(1).values
        elif aggregate == "mean":
            out = torch.where(ends, belief, torch.zeros_like(belief)).sum(1) / n.clamp(min=1)
        else:  # "last": the belief at the last step end
            last = torch.where(ends, torch.arange(ends.shape[1]).expand_as(ends), -1).max(1).values
            out = belief.gather(1, last.clamp(min=0)[:, None])[:, 0]
        return torch.where(n > 0, out, torch.zeros_like(out))

    return scorer
