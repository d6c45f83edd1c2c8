"""Real small pieces for the PPO tests, on GRPO's parity task (tests/rl/rl_fixtures): a tiny random Mistral saved as
a checkpoint (the critic's trunk comes from it through align.rl.ppo.critic, as in the stage), the native sampler on a
copy, the frozen reference scored from another copy, and PPO's module and batch source."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent.parent / "rl"))
from rl_fixtures import EOS, decode, make_client, parity_prompts, parity_verifier, tiny_model  # noqa: E402

from align.model.checkpoint import save_checkpoint  # noqa: E402
from align.rl.ppo.batch_source import PpoBatchSource  # noqa: E402
from align.rl.ppo.gae import GaeConfig  # noqa: E402
from align.rl.ppo.loss import PpoLossConfig  # noqa: E402
from align.rl.ppo.module import PpoTrainModule  # noqa: E402
from align.rl.ppo.stage_config import PpoConfig  # noqa: E402
from align.rl.curriculum import CurriculumConfig, PromptCurriculum  # noqa: E402
from align.rl.rewards import CompositeReward, RewardConfig  # noqa: E402
from align.rl.stage_config import DynamicSamplingConfig, RolloutShape  # noqa: E402
from align.rl.token_logprobs import completion_logprobs  # noqa: E402
from align.train.optim import OptimizerConfig  # noqa: E402
from align.train.parallel import ParallelConfig  # noqa: E402
from align.reward.rm_module import RmHeadConfig, critic_from_policy  # noqa: E402
from align.train.schedulers import SchedulerConfig  # noqa: E402
from align.train.train_module import TrainModuleConfig  # noqa: E402
from align.utils.dist import barrier  # noqa: E402

SHAPE = RolloutShape(prompts=4, samples=4, max_new_tokens=4, num_minibatches=2, micro_batch_size=8, truncated="keep")


def make_ppo(tmp: Path, ppo=PpoConfig(), loss=PpoLossConfig(), shape=SHAPE, lr=2e-2, steps=10, seed=0,
             gae_cfg=GaeConfig(), reward_model=None, reward_model_weight=1.0, critic_head=RmHeadConfig(),
             parallel=ParallelConfig(), rank=0, world_size=1):
    """(module, client, source) over a fresh tiny policy; the start checkpoint is written under `tmp` (with several
    ranks: by rank 0, before a barrier)."""
    model = tiny_model(seed)
    start = tmp / "start"
    if rank == 0 and not (start / "manifest.json").is_file():
        save_checkpoint(model, start)
    barrier()
    client = make_client(model)
    reference = copy.deepcopy(model).requires_grad_(False)  # before the module wraps (FSDP2 cannot be copied)
    critic = critic_from_policy(start, seed=seed)
    cfg = TrainModuleConfig(optimizer=OptimizerConfig(lr=lr), scheduler=SchedulerConfig(name="constant"),
                            parallel=parallel)
    module = PpoTrainModule(model, critic, cfg, OptimizerConfig(lr=lr), loss, ppo, shape.temperature, steps,
                            seed=seed, client=client, critic_head=critic_head)

    @torch.no_grad()
    def ref_scorer(batch):
        return completion_logprobs(reference, batch, shape.temperature)[0]

    prompts = parity_prompts()
    source = PpoBatchSource(prompts, client, decode, CompositeReward(RewardConfig(), shape.max_new_tokens,
                                                                     parity_verifier),
                            PromptCurriculum(prompts.groups, CurriculumConfig(), seed, rank, world_size), shape,
                            DynamicSamplingConfig(enabled=False), ppo, gae_cfg, seed=seed, eos_id=EOS,
                            policy_version=lambda: module.version, old_scorer=module.score,
                            value_scorer=module.values, ref_scorer=ref_scorer if ppo.kl_beta > 0 else None,
                            world_size=world_size, reward_model=reward_model,
                            reward_model_weight=reward_model_weight)
    return module, client, source
