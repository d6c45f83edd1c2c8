"""Worker of the 2-rank PPO test (test_ppo_distributed.py, launched by torch.distributed.run; also run in-process
with one rank as the reference): PPO on the parity task for 4 steps (a critic-only warmup rollout, then policy and
critic; two epochs per rollout, one extra value-only pass, the KL in the reward) with the policy under `strategy`
and the critic replicated (DDP) or sharded like the policy (FSDP2), once whole and once stopped at step 3
(mid-rollout) and resumed. Rank 0 writes
<out>/<name>.pt: the full policy and critic weights, the critic's Adam moments and the history."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
torch.set_num_threads(1)

from align.rl.ppo.stage_config import PpoConfig  # noqa: E402
from align.rl.stage_config import RolloutShape  # noqa: E402
from align.train.parallel import ParallelConfig  # noqa: E402
from align.train.train_module import localize  # noqa: E402
from align.train.trainer import Trainer, TrainerConfig  # noqa: E402
from align.utils.dist import exit_process, init_distributed, rank, world_size  # noqa: E402
from align.utils.tracking import read_history  # noqa: E402
from ppo_fixtures import make_ppo  # noqa: E402

SHAPE = RolloutShape(prompts=4, samples=4, max_new_tokens=4, num_minibatches=1, epochs=2, micro_batch_size=4,
                     truncated="keep")
PPO = PpoConfig(kl_beta=0.05, critic_warmup_rollouts=1, critic_extra_epochs=1)
STEPS = 4


def run(strategy: str, out: Path, name: str, stop_at: int = STEPS) -> None:
    """`stop_at` < STEPS: stop there (mid-rollout), then a fresh module resumes the run to STEPS."""
    for last in ([stop_at, STEPS] if stop_at < STEPS else [STEPS]):
        module, _client, source = make_ppo(out, ppo=PPO, shape=SHAPE, steps=STEPS,
                                           parallel=ParallelConfig(strategy=strategy), rank=rank(),
                                           world_size=world_size())
        trainer = Trainer(TrainerConfig(max_steps=last, checkpoint_every=1), module, source, out / name)
        code = trainer.fit()
    policy = module.full_model_state_dict()  # collective under FSDP2
    critic = module.full_critic_state_dict()  # collective too: under FSDP2 the critic is sharded like the policy
    if rank() == 0:  # (rank 0's shard of the critic's Adam moments when it is sharded)
        adam = {k: v["exp_avg"].clone() for k, v in localize(module.critic_optimizer.state_dict())["state"].items()}
        torch.save({"code": code, "resumed_from": str(trainer.resumed_from or ""), "policy": policy,
                    "critic": critic, "critic_exp_avg": adam, "history": read_history(out / name / "history.jsonl")},
                   out / f"{name}.pt")


if __name__ == "__main__":
    init_distributed()
    run(sys.argv[1], Path(sys.argv[2]), f"{sys.argv[1]}_ranks{world_size()}")
    run(sys.argv[1], Path(sys.argv[2]), f"{sys.argv[1]}_ranks{world_size()}_resumed", stop_at=3)
    exit_process(0)  # no interpreter finalisation of live gloo state (align.utils.dist.exit_process)
