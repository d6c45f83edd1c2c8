"""Worker of test_moe_ep_train.py: one gloo rank (env:// rendezvous). argv: out_dir ep.

One accumulation window (2 micro-batches of MoE SFT with the load-balance and z-loss terms on, a clip threshold
the gradient exceeds) and one optimizer step through `build_train_module`, for each strategy (DDP fp64, FSDP2
fp32, FSDP2 fp32 + activation checkpointing: the EP all-to-alls rerun inside backward), without and with `parallel.expert_parallel = ep`. Each rank writes <out>/ep<ep>_rank<r>.json: for each
strategy the largest differences EP vs no EP of the finalized expert-shard gradients (against the same slice of
the non-EP averaged gradient), of the replicated gradients, of every weight after the step, and both runs'
grad_norm / clip_coef / norm of the expert gradients alone."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
torch.set_num_threads(1)

from align.model.moe_ep import expert_parallel_of  # noqa: E402
from align.train.grad_norm import global_grad_norm  # noqa: E402
from align.train.moe_module import MoeAuxConfig, build_train_module  # noqa: E402
from align.train.optim import OptimizerConfig  # noqa: E402
from align.train.parallel import ParallelConfig  # noqa: E402
from align.train.sft_loss import SftLossConfig  # noqa: E402
from align.train.sft_module import SftTrainModule  # noqa: E402
from align.train.train_module import AccumInfo, TrainModuleConfig  # noqa: E402
from align.utils.dist import init_distributed, rank, world_size  # noqa: E402
from moe_train_helpers import LB, Z, tiny_moe  # noqa: E402
from train_helpers import sft_batch  # noqa: E402

STRATEGIES = {"ddp": torch.float64, "fsdp": torch.float32, "fsdp_ac": torch.float32}  # name -> model dtype


def local(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def one_step(strategy: str, ep: int) -> dict:
    model = tiny_moe(dtype=STRATEGIES[strategy])
    cfg = TrainModuleConfig(optimizer=OptimizerConfig(lr=1e-2, max_grad_norm=0.05),
                            parallel=ParallelConfig(strategy=strategy.removesuffix("_ac"), expert_parallel=ep,
                                                    activation_checkpointing=strategy.endswith("_ac")))
    module = build_train_module(SftTrainModule, model, cfg, SftLossConfig(fused=False), 1,
                                moe_aux=MoeAuxConfig(load_balance=LB, z_loss=Z), stage="sft")
    every = [[sft_batch(2, 10, seed=300 + 2 * r + i) for i in range(2)] for r in range(world_size())]
    units = float(sum(module.loss_units(b) for mine in every for b in mine))
    for i, batch in enumerate(every[rank()]):
        module.train_batch(batch, AccumInfo(i, 2, units, world_size()))
    module.optim_step()
    groups = expert_parallel_of(model)
    first = 0 if groups is None else groups.local_experts(model.config.num_experts)[0]
    state = {n: (local(p.grad).clone(), local(p.detach()).clone(), first) for n, p in model.named_parameters()}
    experts = [p for n, p in model.named_parameters() if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]
    return {"state": state, "grad_norm": module.last["grad_norm"], "clip_coef": module.last["clip_coef"],
            "expert_norm": global_grad_norm(experts)}  # the shards alone: a shard counted 0 or R times shows here


def compare(plain: dict, ep: dict) -> dict:
    out = {"expert_grads": 0.0, "replicated_grads": 0.0, "weights": 0.0, "grad_norm": [plain["grad_norm"],
           ep["grad_norm"]], "clip_coef": [plain["clip_coef"], ep["clip_coef"]], "expert_grad_scale": 0.0,
           "expert_norm": [plain["expert_norm"], ep["expert_norm"]]}
    for name, (grad, weight, first) in ep["state"].items():
        ref_grad, ref_weight, _ = plain["state"][name]
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            ref_grad, ref_weight = ref_grad[first:first + grad.shape[0]], ref_weight[first:first + grad.shape[0]]
            out["expert_grad_scale"] = max(out["expert_grad_scale"], float(ref_grad.abs().max()))
            key = "expert_grads"
        else:
            key = "replicated_grads"
        out[key] = max(out[key], float((grad - ref_grad).abs().max()))
        out["weights"] = max(out["weights"], float((weight - ref_weight).abs().max()))
    return out


def main() -> None:
    out, ep = Path(sys.argv[1]), int(sys.argv[2])
    init_distributed()
    result = {s: compare(one_step(s, 1), one_step(s, ep)) for s in STRATEGIES}
    (out / f"ep{ep}_rank{rank()}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
    from align.utils.dist import exit_process

    exit_process(0)
