"""Worker of test_moe_distributed.py (two gloo ranks under torch.distributed.run): each rank runs one accumulation
window of 2 micro-batches of the aux terms alone (no label token) through MoETrainModule under DDP, fp64, for
each load-balance convention and scope 'global'; rank 0 saves the averaged gradients to <out>/grads_<conv>.pt.
Each rank's second micro-batch repeats its first, so the buffer's f after micro-batch 1 already is the window's."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
torch.set_num_threads(1)

from align.train.moe_module import MoeAuxConfig, moe_module  # noqa: E402
from align.train.parallel import ParallelConfig  # noqa: E402
from align.train.sft_loss import SftLossConfig  # noqa: E402
from align.train.sft_module import SftTrainModule  # noqa: E402
from align.train.train_module import AccumInfo, TrainModuleConfig  # noqa: E402
from align.utils.dist import exit_process, init_distributed, rank, world_size  # noqa: E402
from moe_train_helpers import LB, Z, aux_only_batch, tiny_moe  # noqa: E402


def main() -> None:
    init_distributed()
    out = Path(sys.argv[1])
    for convention in ("switch", "hf"):
        model = tiny_moe(dtype=torch.float64)
        cfg = TrainModuleConfig(parallel=ParallelConfig(strategy="ddp"))
        module = moe_module(SftTrainModule)(model, cfg, SftLossConfig(fused=False), total_steps=1,
                                            moe_aux=MoeAuxConfig(load_balance=LB, z_loss=Z, convention=convention))
        batch = aux_only_batch(rank())
        for i in range(2):
            module.train_batch(batch, AccumInfo(i, 2, 1.0, world_size()))
        if rank() == 0:
            torch.save({n: p.grad for n, p in model.named_parameters() if p.grad is not None},
                       out / f"grads_{convention}.pt")


if __name__ == "__main__":
    main()
    exit_process(0)
