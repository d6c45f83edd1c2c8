"""align.stages.ppo: PPO with a critic on verifier rewards (`ppo_checkpoint`, an extra rung beside GRPO).

    python -m align.stages.ppo --config configs/tiny/ppo.toml [table.key=value ...]

Reads what GRPO reads (align.stages.grpo): `<runs>/<data.start>` (the policy's and the reference's initial weights, and
the critic's trunk), `<runs>/<data.prompts>` and `<runs>/<data.eval>`, and with `[reward] model` a reward model (the
`rm_checkpoint` rung's final/) whose score joins the verifier's reward; with `[reward] process_model` a process reward
model (MistralForProcessReward) whose per-step rewards join the per-token rewards (align.rl.ppo.process_rewards). The
sampler is the align Engine on its own copy of the weights, updated in memory after every applied policy step
(align.rl.ppo.module). The receipt's
metrics are GRPO's (align.rl.report.heldout_receipt: held-out greedy accuracy before and after, per level, the
paired interval, the reward curve). Publishes `<run_dir>/final/` (the policy, HF format) and `<run_dir>/critic/`
(the value model, HF MistralForSequenceClassification layout). Resumes from `<run_dir>/checkpoints/` like every
Trainer stage (the critic and its optimizer ride in the module's extra state). One process. `[lora]` as in GRPO
(align.lora.stage): the policy trains adapters, the sampler gets the adapters, final/ is the merged model; the
critic trains in full."""

from __future__ import annotations

from align.config import load_cli_config
from align.eval.inloop import build_inloop_eval
from align.exit_codes import exit_stage
from align.model.checkpoint import DTYPES, checkpoint_content_hash, load_checkpoint, save_checkpoint, \
    tokenizer_dir_for
from align.model.mistral import MistralForProcessReward, MistralForValueHead
from align.rl.ppo.batch_source import PpoBatchSource
from align.lora.checkpoint import lora_weight_format
from align.lora.stage import maybe_lora, publish_final
from align.rl.ppo.module import PpoTrainModule
from align.rl.ppo.process_rewards import newline_token_ids, process_reward_scorer
from align.rl.ppo.rewards import reward_model_scorer
from align.rl.ppo.stage_config import PpoStageConfig
from align.rl.batch_source import PromptSet
from align.eval.canary import Canary
from align.rl.curriculum import PromptCurriculum
from align.rl.environment import episode_runner
from align.rl.env_eval import env_receipt_evals
from align.rl.report import fit_with_receipt, receipt_evals
from align.rl.reward_models import build_reward
from align.rl.stage_inputs import open_rl_stage
from align.rl.tripwires import GrpoHealth, HealthCallback
from align.stages.grpo import reference_scorer
from align.train.callbacks import ProgressLine, SpeedMonitor
from align.train.identity import run_identity
from align.reward.rm_module import critic_from_policy
from align.train.train_module import TrainModuleConfig
from align.train.trainer import Trainer
from align.utils.dist import device, is_rank0, rank, world_size


def main() -> int:
    cfg = load_cli_config(PpoStageConfig, prog="align.stages.ppo")
    inp = open_rl_stage(cfg, "ppo_checkpoint")
    runs, run_dir, start, tok, prompts, heldout, client = (inp.runs, inp.run_dir, inp.start, inp.tok, inp.prompts,
                                                           inp.heldout, inp.client)
    dtype = DTYPES[cfg.data.model_dtype]
    module = PpoTrainModule(maybe_lora(load_checkpoint(start, dtype=dtype, device=device()), cfg.lora, "ppo",
                                       seed=cfg.run.seed),
                            critic_from_policy(start, seed=cfg.run.seed, dtype=dtype, device=device()),
                            TrainModuleConfig(cfg.optimizer, cfg.scheduler, cfg.parallel), cfg.critic_optimizer,
                            cfg.loss, cfg.ppo, cfg.shape.temperature, cfg.train.max_steps, seed=cfg.run.seed,
                            client=client, health=GrpoHealth(cfg.health), critic_head=cfg.critic_head)
    prompt_set, decode = PromptSet.from_shards(prompts), (lambda ids: tok.decode(ids, skip_special_tokens=True))
    inputs = {"start": checkpoint_content_hash(start), "prompts": prompts.digest}
    reward_model = None
    if cfg.reward.model:  # a Bradley-Terry critic (rm_checkpoint) scores every sample beside the verifier
        rm_dir = runs / cfg.reward.model
        reward_model = reward_model_scorer(load_checkpoint(rm_dir, dtype=dtype, device=device(),
                                                           cls=MistralForValueHead))
        inputs["reward_model"] = checkpoint_content_hash(rm_dir)
    process_reward = None
    if cfg.reward.process_model:  # a PRM's per-step rewards (align.rl.ppo.process_rewards)
        prm_dir = runs / cfg.reward.process_model
        process_reward = process_reward_scorer(
            load_checkpoint(prm_dir, dtype=dtype, device=device(), cls=MistralForProcessReward),
            newline_token_ids(tok), tok.eos_id, cfg.reward.process_weight)
        inputs["process_model"] = checkpoint_content_hash(prm_dir)
    reward, reward_inputs = build_reward(cfg.reward, cfg.shape.max_new_tokens, runs, tok, dtype, device())
    inputs.update(reward_inputs)  # [reward] terms' models (none for the older keys)
    source = PpoBatchSource(
        prompt_set, client, decode, reward,
        PromptCurriculum(prompt_set.groups, cfg.curriculum, cfg.run.seed, rank(), world_size(), prompt_set.mixture),
        cfg.shape,
        cfg.dynamic_sampling, cfg.ppo, cfg.gae, seed=cfg.run.seed, eos_id=tok.eos_id,
        policy_version=lambda: module.version,
        old_scorer=module.score if cfg.shape.old_logprobs == "recompute" else None, value_scorer=module.values,
        ref_scorer=reference_scorer(start, cfg) if cfg.ppo.kl_beta > 0 else None, world_size=world_size(),
        reward_model=reward_model, reward_model_weight=cfg.reward.model_weight, process_reward=process_reward,
        episodes=episode_runner(cfg.environment, client, tok, cfg.shape))  # [environment]: multi-turn; else None
    evals = receipt_evals(cfg.data, client, heldout, prompts, decode, tok.eos_id)
    if cfg.environment is not None:  # the policy's episodes, not its first turn (align.rl.env_eval)
        evals = env_receipt_evals(cfg, evals, client, tok, PromptSet.from_shards(heldout), prompt_set)
    before = evals()
    n_params = sum(p.numel() for p in module.model.parameters()) + sum(p.numel() for p in module.critic.parameters())
    callbacks = [SpeedMonitor(n_params), HealthCallback(module.health),
                 Canary(cfg.canary, client, evals.heldout, cfg.shape.max_new_tokens, cfg.run.seed),
                 ProgressLine(cfg.train.max_steps, label="ppo")]
    inloop = build_inloop_eval(cfg.inloop_eval, runs, tok, module, cfg.train.max_steps, client=client)
    callbacks += [inloop] if inloop is not None else []
    trainer = Trainer(cfg.train, module, source, run_dir, callbacks, identity=run_identity(cfg, inputs),
                      weight_format=lora_weight_format(cfg.lora, module.model, start, run_dir))  # None: no [lora]
    code = fit_with_receipt(trainer, evals, before, checkpoint_content_hash(start), run_dir, "ppo")
    if code != 0:
        return code
    critic = module.full_critic_state_dict()  # collective: a sharded critic is gathered to rank 0
    if is_rank0():
        save_checkpoint(module.critic, run_dir / "critic", state=critic)
    publish_final(trainer, cfg.lora, run_dir / "final", tokenizer_dir=tokenizer_dir_for(start),
                  inputs=inputs)  # collective; with [lora] the merged policy (+ final/adapter/)
    return 0


if __name__ == "__main__":
    exit_stage(main)
