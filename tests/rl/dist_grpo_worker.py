"""Worker for the 2-rank GRPO test (launched by torch.distributed.run from test_grpo_distributed.py): the parity task
for 3 steps under `strategy` (ddp or fsdp), each rank sampling its own half of the prompts with its own sampler.
Rank r writes <out>/<strategy>_rank<r>.pt: the full trained weights (gathered), its sampler's weights and version,
the prompt rows it sampled, and the logged rewards."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
torch.set_num_threads(1)

from align.rl.stage_config import RolloutShape  # noqa: E402
from align.train.parallel import ParallelConfig  # noqa: E402
from align.train.trainer import Trainer, TrainerConfig  # noqa: E402
from align.utils.dist import exit_process, init_distributed, rank, world_size  # noqa: E402
from align.utils.tracking import read_history  # noqa: E402
from rl_fixtures import make_client, make_module, make_source, tiny_model  # noqa: E402


def main(strategy: str, out: Path) -> None:
    init_distributed()
    model = tiny_model()
    client = make_client(model)
    module = make_module(model, client, lr=2e-2, steps=3, parallel=ParallelConfig(strategy=strategy))
    shape = RolloutShape(prompts=4, samples=4, max_new_tokens=4, num_minibatches=2, micro_batch_size=4,
                         truncated="keep")
    source = make_source(module, client, shape=shape, world_size=world_size(), rank=rank())
    sampled: list[int] = []
    generate = client.generate

    def spy(requests):
        sampled.extend(int(r.request_id) for r in requests)
        return generate(requests)

    client.generate = spy
    run_dir = out / strategy
    code = Trainer(TrainerConfig(max_steps=3), module, source, run_dir).fit()
    full = module.full_model_state_dict() if strategy == "fsdp" else None  # collective
    weights = {k: v.detach().clone() for k, v in (module.model.state_dict().items() if full is None else
                                                       {} if rank() else full.items())}
    engine = {k: v.detach().clone() for k, v in client.engine.model.state_dict().items()}
    rewards = [r["reward_mean"] for r in read_history(run_dir / "history.jsonl")] if rank() == 0 else []
    torch.save({"code": code, "weights": weights, "engine": engine, "version": client.weight_version,
                "step": module.version, "sampled": sampled, "rewards": rewards}, out / f"{strategy}_rank{rank()}.pt")


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
    exit_process(0)  # no interpreter finalisation of live gloo state (align.utils.dist.exit_process)
