"""Worker of test_moe_ep.py: one rank (env:// rendezvous). argv: out_dir ep case [backend]; backend gloo (CPU, the
default) or nccl (each rank on GPU LOCAL_RANK).

Every rank builds the same full fp64 model from one seed, keeps a copy as the single-process reference, shards the
other with apply_expert_parallel, and runs its own tokens through it. The reference runs the rank-ordered
concatenation of the EP group's tokens. Each rank writes <out>/<case>_rank<r>.json: the largest absolute
difference of every compared quantity (0.0 = bitwise equal), the rows its experts received, and whether every
expert shard has a gradient.

cases: block (random router, a different token count per rank), adversarial (every token to the last EP rank's
experts: the others receive zero rows), model (OlmoeForCausalLM, next-token CE summed over the local tokens),
desync (one rank a forward call ahead: the error each rank raises), grouped (adversarial with the grouped_mm
backend, fp32: its kernel has no fp64)."""

from __future__ import annotations

import copy
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
torch.set_num_threads(1)

from align.model.moe import SparseMoeBlock  # noqa: E402
from align.model.moe_ep import apply_expert_parallel, expert_parallel_groups, moe_blocks  # noqa: E402
from align.model.olmoe import OlmoeForCausalLM  # noqa: E402
from align.utils.dist import exit_process  # noqa: E402
from moe_helpers import tiny_olmoe  # noqa: E402

D, I, E, K = 16, 8, 8, 2
DEVICE = torch.device("cpu")  # main() moves it to this rank's GPU under nccl
DTYPE = {"loop": torch.float64, "grouped": torch.float32}  # grouped_mm has no fp64 kernel


def worst(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return float((a - b).detach().abs().max()) if a.numel() else 0.0


def tokens_of(r: int, adversarial: bool) -> torch.Tensor:
    x = torch.randn(5 + 3 * r, D, generator=torch.Generator().manual_seed(10 + r), dtype=torch.float64)
    if adversarial:
        x[:, 0] = x[:, 0].abs() + 1.0  # a positive feature the rigged router reads
    return x.to(DEVICE)


def rig_router(block: SparseMoeBlock, ep: int) -> None:
    """Every token's top-k inside the last EP rank's experts (distinct margins: no ties in the top-k)."""
    last = range(E - E // ep, E)
    with torch.no_grad():
        block.gate.weight.mul_(0.01)
        for j, e in enumerate(last):
            block.gate.weight[e, 0] += 20.0 + j


def grads_diff(model, ref, groups) -> dict:
    """Expert shards against the reference's slice (bitwise); every other gradient summed over the EP group
    against the reference's (a data-parallel sum: equal up to the order of the additions)."""
    out = {"expert_grads": 0.0, "replicated_grads": 0.0, "expert_grads_present": True}
    ref_params = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        q = ref_params[name]
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            first = groups.local_experts(E)[0]
            out["expert_grads_present"] &= p.grad is not None
            if p.grad is not None:
                out["expert_grads"] = max(out["expert_grads"], worst(p.grad, q.grad[first:first + p.shape[0]]))
        else:
            g = p.grad.clone()
            dist.all_reduce(g, group=groups.ep_group)
            out["replicated_grads"] = max(out["replicated_grads"], worst(g, q.grad))
    return out


def run_block(groups, adversarial: bool, backend: str = "loop") -> dict:
    torch.manual_seed(0)
    ref = SparseMoeBlock(D, I, E, K, norm_topk_prob=False, backend=backend).double()
    for m in (ref.gate, ref.experts):
        m.init_parameters(0.5)
    ref.to(DEVICE, DTYPE[backend])
    if adversarial:
        rig_router(ref, groups.ep)
    block = apply_expert_parallel(copy.deepcopy(ref), groups)
    first_rank = groups.rank - groups.ep_rank
    dtype = DTYPE[backend]
    xs = [tokens_of(first_rank + p, adversarial).to(dtype) for p in range(groups.ep)]
    probes = [torch.randn(x.shape, generator=torch.Generator().manual_seed(50 + i), dtype=torch.float64).to(DEVICE, dtype)
              for i, x in enumerate(xs)]
    sl = slice(sum(x.shape[0] for x in xs[:groups.ep_rank]), sum(x.shape[0] for x in xs[:groups.ep_rank + 1]))
    result = {}
    # pass 2 feeds the routers a detached input: the input gradient is then the expert path's alone (the router's
    # dense (N, E) @ (E, d) backward GEMM rounds differently for N rows than for all ranks' rows: not EP's doing)
    for detached in (False, True):
        if detached:
            for m in (block, ref):
                m.gate.forward = lambda x, g=m.gate: F.linear(x.detach(), g.weight)
                m.zero_grad(set_to_none=True)
        mine = xs[groups.ep_rank].clone().requires_grad_(True)
        out, logits = block(mine)
        loss = (out * probes[groups.ep_rank]).sum()
        loss.backward()
        everything = torch.cat(xs).requires_grad_(True)
        ref_out, ref_logits = ref(everything)
        ref_losses = [(o * pr).sum() for o, pr in zip(ref_out.split([x.shape[0] for x in xs]), probes)]
        sum(ref_losses[1:], ref_losses[0]).backward()
        if detached:
            result["input_grad_expert_path"] = worst(mine.grad, everything.grad[sl])
            continue
        result.update({"out": worst(out, ref_out[sl]), "logits": worst(logits, ref_logits[sl]),
                       "loss": abs(float((loss - ref_losses[groups.ep_rank]).detach())),
                       "input_grad": worst(mine.grad, everything.grad[sl]),
                       "received_rows": int(block.experts.received_rows)})
        result.update(grads_diff(block, ref, groups))
    return result


def run_model(groups) -> dict:
    cfg = tiny_olmoe(hidden_size=32, intermediate_size=16, num_experts=E, num_experts_per_tok=K, vocab_size=64)
    torch.manual_seed(0)
    ref = OlmoeForCausalLM(cfg).double().to(DEVICE)
    model = apply_expert_parallel(copy.deepcopy(ref), groups)
    first_rank = groups.rank - groups.ep_rank
    batches = [torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(20 + first_rank + p)).to(DEVICE)
               for p in range(groups.ep)]

    def ce(logits, ids):
        return F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten(), reduction="sum")

    ids = batches[groups.ep_rank]
    logits = model(ids)
    loss = ce(logits, ids)
    loss.backward()
    ref_logits = ref(torch.cat(batches))
    pieces = ref_logits.split(2)
    ref_losses = [ce(lg, b) for lg, b in zip(pieces, batches)]
    sum(ref_losses[1:], ref_losses[0]).backward()
    result = {"logits": worst(logits, pieces[groups.ep_rank]), "loss": abs(float((loss - ref_losses[groups.ep_rank]).detach())),
              "received_rows": sum(int(b.experts.received_rows) for _, b in moe_blocks(model))}
    result.update(grads_diff(model, ref, groups))
    return result


def run_desync(groups) -> dict:
    """EP rank 0 one forward call ahead: the count exchange reports it on every rank instead of hanging."""
    torch.manual_seed(0)
    block = SparseMoeBlock(D, I, E, K, norm_topk_prob=False).double()
    for m in (block.gate, block.experts):
        m.init_parameters(0.5)
    block = apply_expert_parallel(block.to(DEVICE), groups)
    if groups.ep_rank == 0:
        block.experts.serial += 1
    try:
        block(tokens_of(groups.rank, False))
    except RuntimeError as err:
        return {"error": str(err)}
    return {"error": None}


CASES = {"block": lambda g: run_block(g, False), "adversarial": lambda g: run_block(g, True), "model": run_model,
         "grouped": lambda g: run_block(g, True, backend="grouped"),
         "desync": run_desync}


def main() -> None:
    global DEVICE
    out, ep, case = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    backend = sys.argv[4] if len(sys.argv) > 4 else "gloo"
    if backend == "nccl":
        DEVICE = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(DEVICE)
    dist.init_process_group(backend)
    groups = expert_parallel_groups(ep)
    result = CASES[case](groups)
    (out / f"{case}_ep{ep}_{backend}_rank{groups.rank}.json").write_text(json.dumps(result))
    exit_process(0)  # not a plain exit: gloo's threads can abort a finished rank at finalisation (docs/RELIABILITY.md)


if __name__ == "__main__":
    main()
