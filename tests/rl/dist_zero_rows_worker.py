"""Worker for the 2-rank test of rows left out of the forward (test_grpo_distributed.py): rank 1's verifier judges
every sample wrong, so under `negative_scale = 0` it leaves every row out while rank 0 trains some; both modes
("train", "skip") run 2 steps under `strategy`, and rank 0 writes <out>/<strategy>_zero_rows.pt: their histories."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
torch.set_num_threads(1)

from align.rl.advantages import AdvantageConfig  # noqa: E402
from align.rl.grpo_loss import GrpoLossConfig  # noqa: E402
from align.rl.stage_config import RolloutShape  # noqa: E402
from align.rl.zero_rows import row_rule  # noqa: E402
from align.train.parallel import ParallelConfig  # noqa: E402
from align.train.trainer import Trainer, TrainerConfig  # noqa: E402
from align.utils.dist import exit_process, init_distributed, rank, world_size  # noqa: E402
from align.utils.tracking import read_history  # noqa: E402
from rl_fixtures import make_client, make_module, make_source, never_right, parity_verifier, tiny_model  # noqa: E402


def main(strategy: str, out: Path) -> None:
    init_distributed()
    histories = {}
    for mode in ("train", "skip"):
        model = tiny_model()
        client = make_client(model)
        module = make_module(model, client, lr=2e-2, steps=2, parallel=ParallelConfig(strategy=strategy))
        shape = RolloutShape(prompts=4, samples=4, max_new_tokens=4, num_minibatches=2, micro_batch_size=2,
                             truncated="keep")
        source = make_source(module, client, shape=shape, world_size=world_size(), rank=rank(),
                             verifier=parity_verifier if rank() == 0 else never_right,
                             advantage=AdvantageConfig(negative_scale=0.0),
                             skip_rows=row_rule(GrpoLossConfig(zero_gradient_rows=mode), (0.0, 0.0)))
        code = Trainer(TrainerConfig(max_steps=2), module, source, out / f"{strategy}_{mode}").fit()
        histories[mode] = {"code": code, "rows": read_history(out / f"{strategy}_{mode}" / "history.jsonl")
                           if rank() == 0 else []}
    if rank() == 0:
        torch.save(histories, out / f"{strategy}_zero_rows.pt")


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
    exit_process(0)
