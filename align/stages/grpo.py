"""align.stages.grpo: GRPO on verifier rewards (`grpo_checkpoint`).

    python -m align.stages.grpo --config configs/tiny/grpo.toml [table.key=value ...]

Reads `<runs>/<data.start>` (the policy's initial weights: the DPO checkpoint, or SFT in a profile that says so),
`<runs>/<data.prompts>` (RL prompts with gold answers) and `<runs>/<data.eval>` (held-out prompts). The sampler is
the align Engine on its own copy of the weights (`data.engine_dtype`), updated in memory after every optimizer step.
Before training and after it, greedy verifier-judged accuracy on the held-out prompts: `<run_dir>/metrics.json`
(the receipt's metrics) holds both, their difference, and the reward curve's first and last stretch from
`history.jsonl`; with `[environment]` these are greedy episodes through the environment, and metrics.json's
`environment` block adds the tool-call rate, calls, parse rate before and after (align.rl.env_eval). Publishes
`<run_dir>/final/` (HF format). Resumes from `<run_dir>/checkpoints/` like every Trainer stage. `<runs>` is
$ALIGN_RUNS_DIR under the pipeline, else runs/tiny."""

from __future__ import annotations

from pathlib import Path

import torch

from align.config import load_cli_config
from align.eval.inloop import build_inloop_eval
from align.exit_codes import exit_stage
from align.kernels.fused_ce import use_native
from align.model.checkpoint import DTYPES, checkpoint_content_hash, load_checkpoint, tokenizer_dir_for
from align.lora.checkpoint import lora_weight_format
from align.lora.stage import maybe_lora, publish_final
from align.rl.batch_source import GrpoBatchSource, PromptSet
from align.eval.canary import Canary
from align.rl.curriculum import PromptCurriculum
from align.rl.grpo_module import GrpoTrainModule
from align.rl.report import fit_with_receipt, receipt_evals
from align.rl.environment import episode_runner
from align.rl.env_eval import env_receipt_evals
from align.rl.reward_models import build_reward
from align.rl.stage_config import GrpoStageConfig
from align.rl.stage_inputs import open_rl_stage
from align.rl.token_logprobs import completion_logprobs
from align.rl.tripwires import GrpoHealth, HealthCallback
from align.rl.zero_rows import row_rule
from align.train.callbacks import ProgressLine, SpeedMonitor
from align.train.identity import run_identity
from align.train.moe_module import build_train_module, moe_callbacks
from align.train.train_module import TrainModuleConfig
from align.train.trainer import Trainer
from align.utils.dist import device, rank, world_size

def reference_scorer(start: Path, cfg: GrpoStageConfig, kernel: str = "torch"):
    """Log-probs under the frozen start weights (only built when a KL term needs them); `kernel`: the policy's
    `[loss] kernel`, so that the same head rows give k3 = 0 exactly at the start."""
    ref = load_checkpoint(start, dtype=DTYPES[cfg.data.model_dtype], device=device()).eval().requires_grad_(False)
    native = use_native(kernel, device())

    @torch.no_grad()
    def scorer(batch: dict) -> torch.Tensor:
        batch = {k: v.to(device()) if torch.is_tensor(v) else v for k, v in batch.items()}
        return completion_logprobs(ref, batch, cfg.shape.temperature, cfg.loss.chunk_size, native=native)[0]

    return scorer


def main() -> int:
    cfg = load_cli_config(GrpoStageConfig, prog="align.stages.grpo")
    inp = open_rl_stage(cfg, "grpo_checkpoint")
    runs, run_dir, start, tok, prompts, heldout, client = (inp.runs, inp.run_dir, inp.start, inp.tok, inp.prompts,
                                                           inp.heldout, inp.client)
    policy = maybe_lora(load_checkpoint(start, dtype=DTYPES[cfg.data.model_dtype], device=device()), cfg.lora, "grpo",
                        seed=cfg.run.seed)
    module = build_train_module(GrpoTrainModule, policy,
                                TrainModuleConfig(cfg.optimizer, cfg.scheduler, cfg.parallel), cfg.loss,
                                cfg.shape.temperature, cfg.shape.max_new_tokens, cfg.train.max_steps,
                                seed=cfg.run.seed, client=client, health=GrpoHealth(cfg.health),
                                moe_aux=cfg.moe_aux, stage="grpo")
    prompt_set, decode = PromptSet.from_shards(prompts), (lambda ids: tok.decode(ids, skip_special_tokens=True))
    needs_ref = cfg.loss.kl_beta > 0 or cfg.reward.kl_coef > 0
    reward, reward_inputs = build_reward(cfg.reward, cfg.shape.max_new_tokens, runs, tok,
                                         DTYPES[cfg.data.model_dtype], device())  # [reward] terms' models
    source = GrpoBatchSource(
        prompt_set, client, decode, reward,
        PromptCurriculum(prompt_set.groups, cfg.curriculum, cfg.run.seed, rank(), world_size(), prompt_set.mixture),
        cfg.shape,
        cfg.dynamic_sampling, cfg.advantage, seed=cfg.run.seed, eos_id=tok.eos_id,
        policy_version=lambda: module.version,
        old_scorer=module.score if cfg.shape.old_logprobs == "recompute" else None,
        ref_scorer=reference_scorer(start, cfg, cfg.loss.kernel) if needs_ref else None, world_size=world_size(),
        skip_rows=row_rule(cfg.loss, cfg.moe_aux.coefficients("grpo")), step_credit=cfg.step_credit,
        episodes=episode_runner(cfg.environment, client, tok, cfg.shape))  # [environment]: multi-turn; else None
    evals = receipt_evals(cfg.data, client, heldout, prompts, decode, tok.eos_id)
    if cfg.environment is not None:  # the policy's episodes, not its first turn (align.rl.env_eval)
        evals = env_receipt_evals(cfg, evals, client, tok, PromptSet.from_shards(heldout), prompt_set)
    before = evals()
    n_params = sum(p.numel() for p in module.model.parameters())
    callbacks = [SpeedMonitor(n_params), HealthCallback(module.health),
                 Canary(cfg.canary, client, evals.heldout, cfg.shape.max_new_tokens, cfg.run.seed),
                 ProgressLine(cfg.train.max_steps, label="grpo")]
    inloop = build_inloop_eval(cfg.inloop_eval, runs, tok, module, cfg.train.max_steps, client=client)
    callbacks += [inloop] if inloop is not None else []
    callbacks += moe_callbacks(cfg.moe_aux)
    inputs = {"start": checkpoint_content_hash(start), "prompts": prompts.digest, **reward_inputs}
    trainer = Trainer(cfg.train, module, source, run_dir, callbacks, identity=run_identity(cfg, inputs),
                      weight_format=lora_weight_format(cfg.lora, module.model, start, run_dir))  # None: no [lora]
    code = fit_with_receipt(trainer, evals, before, checkpoint_content_hash(start), run_dir, "grpo")
    if code != 0:
        return code
    publish_final(trainer, cfg.lora, run_dir / "final", tokenizer_dir=tokenizer_dir_for(start),
                  inputs=inputs)  # collective
    return 0


if __name__ == "__main__":
    exit_stage(main)
