"""Worker of test_moe_distributed.py (two gloo ranks under torch.distributed.run).

1. Each rank runs one accumulation window of 2 micro-batches of the aux terms alone (no label token) through
   MoETrainModule under DDP, fp64, for each load-balance convention and scope 'global'; rank 0 saves the averaged
   gradients to <out>/grads_<conv>.pt. Each rank's second micro-batch repeats its first, so the buffer's f after
   micro-batch 1 already is the window's.
2. A 4-step MoE SFT run under FSDP2 (the 3-D expert parameters sharded on dim 0) and FSDP2 with activation
   checkpointing, on rank r's share of the global windows; rank 0 saves the final weights to <out>/<variant>.pt
   (histories in <out>/<variant>/)."""

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
from dist_worker import rank_loader  # noqa: E402
from moe_train_helpers import LB, Z, aux_only_batch, tiny_moe  # noqa: E402
from train_helpers import build_sft, weights  # noqa: E402

FSDP_VARIANTS = {"moe_fsdp": {}, "moe_fsdp_ac": {"activation_checkpointing": True}}


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
    for name, parallel in FSDP_VARIANTS.items():
        t = build_sft(out / name, accum=2, strategy="fsdp", loader=rank_loader(), max_steps=4, checkpoint_every=0,
                      model=tiny_moe(), base=moe_module(SftTrainModule), parallel=parallel)
        assert t.fit() == 0
        w = weights(t.module)
        if rank() == 0:
            torch.save(w, out / f"{name}.pt")


if __name__ == "__main__":
    main()
    exit_process(0)
