"""The `[reward]` of an RL stage, built: `build_reward` (the term list of align.rl.reward_terms, with the model
terms' checkpoints loaded and the user's worker started), and `score_model_terms`, which adds the model terms to a
round's scored groups.

A model term scores every sample of a sampling round on its tokens (prompt + completion, the layout of
align.rl.types), in micro-batches, before dynamic sampling looks at the group's rewards: so a reward model's score
can make a group worth training on in GRPO as well as in PPO. `reward_model`: the Bradley-Terry model's score on
the last real token (align.rl.ppo.rewards.reward_model_scorer, as rm_module trains it); `process_reward_model`: the
PRM's step beliefs aggregated per completion (align.rl.ppo.process_rewards.process_sequence_scorer). Each adds
weight x score to a valid sample's total and (label, score) to its terms. PPO's older `[reward] model` /
`process_model` keys keep their own path (align.rl.ppo.batch_source: after the rollout is assembled; the PRM per
token)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Sequence

import torch

from align.model.checkpoint import checkpoint_content_hash, load_checkpoint
from align.model.mistral import MistralForProcessReward, MistralForValueHead
from align.rl.assembly import assemble, select_rows
from align.rl.ppo.process_rewards import newline_token_ids, process_sequence_scorer
from align.rl.ppo.rewards import reward_model_scorer
from align.rl.rewards import CompositeReward, RewardConfig
from align.rl.types import Group, ScoredSample
from align.exceptions import ConfigError


def build_reward(cfg: RewardConfig, max_new_tokens: int, runs: Path, tok, dtype: torch.dtype, device
                 ) -> tuple[CompositeReward, dict[str, str]]:
    """The stage's CompositeReward and the content hashes of the models it loaded (the run's identity inputs)."""
    reward = CompositeReward(cfg, max_new_tokens)
    inputs: dict[str, str] = {}
    for term in reward.batch_terms:
        path = runs / term.cfg.path
        if not path.is_dir():
            raise ConfigError(f"[reward] term {term.key!r}: no checkpoint at {path}")
        if term.cfg.name == "reward_model":
            term.scorer = reward_model_scorer(load_checkpoint(path, dtype=dtype, device=device,
                                                              cls=MistralForValueHead))
        else:
            term.scorer = process_sequence_scorer(
                load_checkpoint(path, dtype=dtype, device=device, cls=MistralForProcessReward),
                newline_token_ids(tok), tok.eos_id, term.cfg.opt("aggregate", "min"))
        inputs[f"reward_term/{term.key}"] = checkpoint_content_hash(path)
    for term in reward.terms:
        term.start()  # a user's function is imported now: a bad path stops the stage before the first rollout
    return reward, inputs


def score_model_terms(groups: Sequence[Group], reward: CompositeReward, micro_batch_size: int) -> list[Group]:
    """`groups` with every model term's weighted score added to each valid sample's total."""
    if not reward.batch_terms or not groups:
        return list(groups)
    samples = [s for g in groups for s in g.samples]
    batch = assemble(groups, torch.zeros(len(samples)), "keep")
    scores = []
    for term in reward.batch_terms:
        if term.scorer is None:
            raise RuntimeError(f"reward term {term.key!r} has no model attached (align.rl.reward_models.build_reward)")
        out = torch.zeros(len(samples))
        for rows in torch.arange(len(samples)).split(micro_batch_size):
            out[rows] = term.scorer(select_rows(batch, rows)).float().cpu()
        scores.append(out.tolist())
    it = iter(range(len(samples)))
    rebuilt = []
    for g in groups:
        new = []
        for s in g.samples:
            i = next(it)
            r = s.reward
            if r.valid:
                total, terms = r.total, list(r.terms)
                for term, col in zip(reward.batch_terms, scores):
                    total = total + term.weight * col[i]
                    terms.append((term.key, col[i]))
                r = replace(r, total=total, terms=tuple(terms))
            new.append(ScoredSample(s.prompt_row, s.prompt_ids, s.completion_ids, s.rollout_logprobs,
                                    s.finish_reason, s.weight_version, r))
        rebuilt.append(Group(g.prompt_row, tuple(new)))
    return rebuilt
