"""align.train.offload_adamw: fp32 master + moments in host memory, chunked host step. On a CPU host and device are
the same memory, so the logic is proven here: equal to torch AdamW (fp32, both weight-decay groups) over 20 steps,
bit-exact state_dict resume (fp32 and bf16 parameters), the bf16 parameter is its fp32 master rounded, the real
Trainer with `optimizer.name = "offload_adamw"` (including a crash and resume), and 2 gloo ranks under FSDP2 (each
rank offloading its own shard) equal one process. The CUDA copies (pinned slots, side stream) need a GPU."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from align.train.offload_adamw import OffloadAdamW
from align.train.optim import OptimizerConfig, make_optimizer, param_groups
from train_helpers import assert_bitwise_equal, build_sft, sft_batch, tiny_model, weights

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).parent / "offload_dist_worker.py"
CFG = OptimizerConfig(name="offload_adamw", lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
CHUNK = 1024  # small staging chunks: most tensors of the tiny model span several (and a partial last one)


def _loss(model, i: int) -> torch.Tensor:
    b = sft_batch(2, 16, seed=100 + i)
    logits = model(b["input_ids"]).float()
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), b["input_ids"][:, 1:].flatten(), ignore_index=-100)


def _offload(model, chunk=CHUNK):
    return OffloadAdamW(param_groups(model, CFG), lr=CFG.lr, betas=CFG.betas, eps=CFG.eps,
                        weight_decay=CFG.weight_decay, chunk_numel=chunk)


def _run(model, opt, steps: int, first: int = 0, snapshot_at: int | None = None):
    snap = None
    for i in range(first, first + steps):
        opt.zero_grad(set_to_none=True)
        _loss(model, i).backward()
        opt.step()
        if snapshot_at == i + 1:
            buf = io.BytesIO()
            torch.save({"model": {k: v.clone() for k, v in model.state_dict().items()}, "opt": opt.state_dict()},
                       buf)
            buf.seek(0)
            snap = torch.load(buf, weights_only=True)  # what the Trainer's resume.pt / optimizer files go through
    return snap


def test_equals_torch_adamw_in_fp32_over_20_steps():
    ref_model, model = tiny_model(0), tiny_model(0)
    groups = param_groups(ref_model, CFG)
    assert [g["weight_decay"] for g in groups] == [0.1, 0.0]  # both groups exercised: decayed and exempt
    ref = torch.optim.AdamW(groups, lr=CFG.lr, betas=CFG.betas, eps=CFG.eps, foreach=False)  # the plain loop
    opt = _offload(model)
    _run(ref_model, ref, 20)
    _run(model, opt, 20)
    for (name, a), b in zip(ref_model.named_parameters(), model.parameters()):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-6, msg=name)
    for p, q in zip(ref_model.parameters(), model.parameters()):  # the host state is AdamW's state
        for key in ("exp_avg", "exp_avg_sq"):  # (gradients of weights equal to 1e-6: moments agree as closely)
            torch.testing.assert_close(opt.state[q][key], ref.state[p][key], rtol=1e-3, atol=1e-8)
        assert opt.state[q]["master"].dtype == torch.float32 and float(opt.state[q]["step"]) == 20


def test_chunking_changes_no_bit():
    a, b = tiny_model(0), tiny_model(0)
    opt = _offload(a, chunk=37)
    assert opt.chunk_numel == 64  # rounded up to whole vectors (the kernel's scalar tail rounds differently)
    _run(a, opt, 5)
    _run(b, _offload(b, chunk=1 << 20), 5)
    assert_bitwise_equal(dict(a.state_dict()), dict(b.state_dict()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_state_dict_resume_is_bit_exact(dtype):
    full = tiny_model(0).to(dtype)
    snap = _run(full, _offload(full), 12, snapshot_at=5)
    resumed = tiny_model(1).to(dtype)  # other initial weights: everything must come from the snapshot
    resumed.load_state_dict(snap["model"])
    opt = _offload(resumed)
    opt.load_state_dict(snap["opt"])
    _run(resumed, opt, 7, first=5)
    assert_bitwise_equal(dict(full.state_dict()), dict(resumed.state_dict()))
    assert all(v["master"].dtype == torch.float32 for v in snap["opt"]["state"].values())


def test_bf16_parameters_are_the_fp32_master_rounded_and_keep_small_updates():
    name = "model.layers.0.mlp.down_proj.weight"
    plain = tiny_model(0).to(torch.bfloat16)  # torch AdamW on the bf16 weights themselves: no master
    model = tiny_model(0).to(torch.bfloat16)
    start = model.state_dict()[name].float()
    opt = OffloadAdamW(model.parameters(), lr=1e-5)  # updates below bf16's resolution of O(0.02) weights
    _run(model, opt, 10)
    _run(plain, torch.optim.AdamW(plain.parameters(), lr=1e-5), 10)
    for p in model.parameters():
        assert p.dtype == torch.bfloat16
        assert torch.equal(p, opt.state[p]["master"].to(torch.bfloat16))
    # the masters moved by ~10 x lr per element; bf16 weights updated in place lose most of those updates
    moved = (opt.state[model.get_parameter(name)]["master"] - start).abs().mean()
    changed = (model.get_parameter(name).float() != start).float().mean()
    changed_plain = (plain.get_parameter(name).float() != start).float().mean()
    assert moved > 5e-5 and changed > 2 * changed_plain, (moved, changed, changed_plain)


def test_refuses_state_of_another_world_size_or_shape():
    model = tiny_model(0)
    opt = _offload(model)
    _run(model, opt, 1)
    sd = opt.state_dict()
    with pytest.raises(ValueError, match="world size 2"):
        _offload(tiny_model(0)).load_state_dict({**sd, "world_size": 2})
    other = tiny_model(0, hidden_size=64)
    with pytest.raises(ValueError, match="needs float32"):
        _offload(other).load_state_dict(sd)


def test_registered_under_its_config_name():
    opt, banner = make_optimizer(tiny_model(0), CFG)
    assert isinstance(opt, OffloadAdamW) and banner.startswith("optimizer offload_adamw")
    assert not opt.pinned  # no CUDA parameters: host memory is plain memory


def test_trainer_run_equals_adamw_and_resumes_bitwise(tmp_path):
    ref = build_sft(tmp_path / "adamw", max_steps=6, checkpoint_every=0, optimizer="adamw")
    assert ref.fit() == 0
    full = build_sft(tmp_path / "full", max_steps=6, checkpoint_every=2, optimizer="offload_adamw")
    assert full.fit() == 0
    got, expected = weights(full.module), weights(ref.module)
    for k in expected:
        torch.testing.assert_close(got[k], expected[k], rtol=0, atol=1e-6, msg=k)

    class Crash(Exception):
        pass

    def fault(module, batch, info, count=[0]):
        count[0] += 1
        if count[0] == 2 * 4 + 1:  # step 5's first micro-batch: after the step-4 checkpoint
            raise Crash()

    cut = build_sft(tmp_path / "cut", max_steps=6, checkpoint_every=2, optimizer="offload_adamw", fault=fault)
    with pytest.raises(Crash):
        cut.fit()
    resumed = build_sft(tmp_path / "cut", max_steps=6, checkpoint_every=2, optimizer="offload_adamw")
    assert resumed.fit() == 0 and resumed.resumed_from.name == "step_4"
    assert_bitwise_equal(weights(full.module), weights(resumed.module))


@pytest.mark.distributed
def test_two_gloo_ranks_fsdp_equal_one_process_and_resume_bitwise(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("the in-process reference would run on the GPU; the 2-rank runs are pinned to CPU")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), CUDA_VISIBLE_DEVICES="")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(WORKER),
           str(tmp_path)]
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    from offload_dist_worker import one_process_reference

    got = torch.load(tmp_path / "ranks.pt", weights_only=True)
    for optimizer in ("offload_adamw", "adamw"):
        expected = one_process_reference(tmp_path / f"single_{optimizer}", optimizer)
        for k in expected:
            torch.testing.assert_close(got["full"][k], expected[k], rtol=0, atol=1e-6, msg=f"{optimizer} {k}")
    assert_bitwise_equal(got["full"], got["resumed"])
    # each rank's host state is exactly its own FSDP2 shard, and rank 0's is the one align.plan counts per rank
    from align.plan import param_shapes, shard_numel
    from train_helpers import tiny_config

    shapes = param_shapes(tiny_config(vocab_size=257))
    assert [c["state"] for c in got["counts"]] == [c["local"] for c in got["counts"]]
    assert got["counts"][0]["local"] == sum(shard_numel(s, 2) for s in shapes)
    assert sum(c["local"] for c in got["counts"]) == sum(torch.Size(s).numel() for s in shapes)
    assert got["counts"][0]["local"] > got["counts"][1]["local"]  # the uneven split is really exercised


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_offload_equals_the_host_only_run_bitwise():
    # bf16 parameters on the GPU, state pinned on the host, chunks through the two staging slots and the side stream:
    # the same bits as the same optimizer with the parameters on the CPU (the host math is the same kernel)
    g = torch.Generator().manual_seed(0)
    shapes = [(3, 10_000), (257, 64), (64,)]  # one tensor over several chunks, an odd one, a small one
    start = [(torch.randn(s, generator=g) * 0.02).to(torch.bfloat16) for s in shapes]
    grads = [[torch.randn(s, generator=g).to(torch.bfloat16) for s in shapes] for _ in range(5)]
    runs = {}
    for dev in ("cpu", "cuda"):
        params = [torch.nn.Parameter(t.to(dev)) for t in start]
        opt = OffloadAdamW([{"params": params[:2], "weight_decay": 0.1}, {"params": params[2:], "weight_decay": 0.0}],
                           lr=1e-3, chunk_numel=4096)
        for step_grads in grads:
            for p, gr in zip(params, step_grads):
                p.grad = gr.to(dev)
            opt.step()
        assert opt.pinned == (dev == "cuda")
        if dev == "cuda":
            assert all(v.is_pinned() for s in opt.state.values() for k, v in s.items() if k != "step")
        runs[dev] = ([p.detach().cpu() for p in params], opt.state_dict())
    for a, b in zip(runs["cpu"][0], runs["cuda"][0]):
        assert torch.equal(a, b)
    for pid, state in runs["cpu"][1]["state"].items():
        for key, value in state.items():
            assert torch.equal(value, runs["cuda"][1]["state"][pid][key]), (pid, key)
