"""align's Triton kernels against the torch paths they replace, forward and gradients, and the selection that gates
them (align.kernels.select, align.kernels.gate, align/model/kernel_gates.py).

Without a GPU the kernels run under Triton's interpreter (TRITON_INTERPRET=1, set here before any kernel is wrapped:
align.kernels.triton_rt wraps at first launch) in fp32 and fp16; the interpreter's bf16 arithmetic is wrong upstream,
so bf16 is proven by the CUDA gates of scripts/gpu_check.sh. With a GPU the same tests run the compiled kernels."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
if importlib.util.find_spec("triton") is None:  # not imported here: the kernels import it at their first launch
    pytest.skip("the triton extra is not installed (pip install -e '.[triton]')", allow_module_level=True)

from align.kernels import (fused_ce, fused_dpo, gate, select, triton_moe, triton_rope, triton_rt,  # noqa: E402
                           triton_swiglu)
from align.model import MistralConfig, MistralForCausalLM, moe  # noqa: E402
from align.model.kernel_gates import SPECS, main as gates_main  # noqa: E402
from align.model.layers import set_kernels  # noqa: E402
from align.model.olmoe import OlmoeConfig, OlmoeForCausalLM  # noqa: E402

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture
def gates(tmp_path, monkeypatch):
    """A private gate directory (never the user's cache), the in-process record cache dropped around the test."""
    monkeypatch.setenv(gate.GATE_DIR_ENV, str(tmp_path / "gates"))
    gate.forget()
    yield tmp_path / "gates"
    gate.forget()


@pytest.mark.parametrize("name", list(SPECS))
def test_kernel_matches_torch_forward_and_gradients(name):
    """Every case of the kernel's gate (fp32 and fp16 here; odd sizes, several chunks, a vocabulary over one block):
    outputs and gradients within the stated tolerance, moe_permute bit for bit."""
    rec = gate.run_gate(SPECS[name], DEV, write=False)
    bad = {c["label"] + " " + c["dtype"]: {k: v for k, v in c["outputs"].items() if not v["ok"]}
           for c in rec["cases"] if not c["ok"]}
    assert rec["passed"], bad
    assert {c["dtype"] for c in rec["cases"]} >= {"float32"}
    for case in rec["cases"]:  # the comparison really looked at outputs and gradients
        assert any(k.startswith("grad_") for k in case["outputs"]) and len(case["outputs"]) >= 2


def _tiny(model_cls, cfg_cls, **extra):
    cfg = cfg_cls(vocab_size=300, hidden_size=48, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, rope_theta=10000.0, rms_norm_eps=1e-5,
                  **extra)
    torch.manual_seed(0)
    model = model_cls(cfg)
    model.init_weights()
    return model.to(DEV)


# the MoE permute kernel is gated per kernel above; the whole OLMoE model through it runs in the slow tier
@pytest.mark.parametrize("family", ["mistral", pytest.param("olmoe", marks=pytest.mark.slow)])
def test_model_with_triton_kernels_matches_torch(family, gates):
    """A whole tiny model (RMSNorm, RoPE, SwiGLU or the MoE permute, and the SFT head) through the selector with
    "triton" equals the same model with "torch": loss and every parameter's gradient (fp32)."""
    assert gates_main(["--device", DEV.type]) == 0
    if family == "mistral":
        model = _tiny(MistralForCausalLM, MistralConfig)
    else:
        model = _tiny(OlmoeForCausalLM, OlmoeConfig, num_experts=6, num_experts_per_tok=2, pad_token_id=1,
                      bos_token_id=None, eos_token_id=2)
    ids = torch.randint(0, 300, (2, 11), generator=torch.Generator().manual_seed(1)).to(DEV)
    labels = ids.clone()
    labels[:, :3] = fused_ce.IGNORE_INDEX

    def loss_and_grads(kernel: str):
        assert set_kernels(model, kernel) >= 5
        model.zero_grad()
        hidden = model.forward_hidden(ids)
        out = fused_ce.fused_linear_cross_entropy(hidden[:, :-1], model.lm_head.weight, labels[:, 1:],
                                                  z_loss_weight=1e-4, chunk_size=8, kernel=kernel)
        out.loss.backward()
        return out.loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    ref_loss, ref_grads = loss_and_grads("torch")
    loss, grads = loss_and_grads("triton")
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-5)
    for n, g in ref_grads.items():
        torch.testing.assert_close(grads[n], g, rtol=1e-4, atol=1e-6, msg=lambda m: f"{n}: {m}")


def test_heads_through_the_selector_match_the_unfused_formulas(gates):
    """kernel="triton" of the SFT head and the DPO log-prob head against the full-logits references (autograd)."""
    assert gates_main(["--device", DEV.type, "--names", "fused_ce,seq_logprob"]) == 0
    g = torch.Generator().manual_seed(3)
    h = torch.randn(3, 9, 16, generator=g).to(DEV).requires_grad_()
    w = (torch.randn(4500, 16, generator=g) * 0.25).to(DEV).requires_grad_()
    y = torch.randint(0, 4500, (3, 9), generator=g).to(DEV)
    y[0, :4] = fused_ce.IGNORE_INDEX
    out = fused_ce.fused_linear_cross_entropy(h, w, y, z_loss_weight=1e-3, chunk_size=5, kernel="triton")
    ref = fused_ce.reference_linear_cross_entropy(h, w, y, z_loss_weight=1e-3)
    got, want = torch.autograd.grad(out.loss, (h, w)), torch.autograd.grad(ref, (h, w))
    torch.testing.assert_close(out.loss, ref, rtol=1e-5, atol=1e-4)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    cot = torch.randn(3, generator=g).to(DEV)
    seq = fused_dpo.sequence_logprobs(h, w, y, chunk_size=4, kernel="triton")
    ref = fused_dpo.reference_sequence_logprobs(h, w, y)
    torch.testing.assert_close(seq.logps, ref, rtol=1e-5, atol=1e-4)
    for a, b in zip(torch.autograd.grad(seq.logps, (h, w), cot), torch.autograd.grad(ref, (h, w), cot)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_auto_on_a_cpu_is_what_it_was(gates):
    """A CPU's "auto" never picks Triton, even with passing records and the interpreter on: the CPU ladders keep
    their bits. The fused head keeps its C rows where they build."""
    if triton_rt.interpreting():
        assert gates_main(["--device", "cpu"]) == 0
    cpu = torch.device("cpu")
    for name in select.NAMES:
        assert select.resolve(name, "auto", cpu) == "torch"
    assert fused_ce.rows_kernel("auto", cpu) == ("native" if fused_ce.ce_rows.available() else "torch")


def test_triton_on_a_cpu_without_the_interpreter_is_a_clear_error(monkeypatch, gates):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(triton_rt.TritonUnavailable, match="TRITON_INTERPRET=1"):
        select.resolve("rms_norm", "triton", torch.device("cpu"))
    with pytest.raises(triton_rt.TritonUnavailable, match="TRITON_INTERPRET=1"):
        fused_ce.fused_linear_cross_entropy(torch.randn(2, 4), torch.randn(8, 4), torch.tensor([1, 2]),
                                            kernel="triton")
    assert gates_main(["--device", "cpu"]) == 2


@pytest.mark.skipif(DEV.type != "cpu", reason="the interpreter's selection rules")
def test_triton_needs_a_passed_and_current_gate_record(gates):
    cpu = torch.device("cpu")
    with pytest.raises(select.KernelGateError, match="no gate record"):
        select.resolve("rope", "triton", cpu)
    assert gates_main(["--device", "cpu", "--names", "rope"]) == 0
    assert select.resolve("rope", "triton", cpu) == "triton"
    path = gate.record_path("rope", "interpret")
    rec = json.loads(path.read_text())
    rec["sources"]["align/kernels/triton_rope.py"] = "0" * 64  # the kernel was edited since the gate ran
    path.write_text(json.dumps(rec))
    gate.forget()
    with pytest.raises(select.KernelGateError, match="other kernel sources"):
        select.resolve("rope", "triton", cpu)
    with pytest.raises(ValueError, match="must be one of"):
        select.resolve("rope", "fast", cpu)


def test_auto_on_cuda_follows_the_gate(monkeypatch):
    """The CUDA branch of "auto", with the record lookup stubbed (no GPU here): Triton only when the gate passed."""
    cuda = torch.device("cuda")
    monkeypatch.setattr(gate, "refusal", lambda name, dev: None)
    assert select.resolve("swiglu", "auto", cuda) == "triton"
    monkeypatch.setattr(gate, "refusal", lambda name, dev: "the gate failed (test)")
    assert select.resolve("swiglu", "auto", cuda) == "torch"


def _mutants():
    """Wrong kernels the gate must refuse: a forward bug, a backward-only bug, a one-ulp error where bits must
    agree, and a head that drops the z-loss term."""
    def rope_sign(i):  # sin negated: the inverse rotation
        y = triton_rope.apply_rope(i["x"], i["cos"], -i["sin"])
        return {"out": y.detach(), "grad_x": torch.autograd.grad(y, i["x"], i["cot"])[0]}

    class _SwappedGrads(torch.autograd.Function):
        @staticmethod
        def forward(ctx, gate_, up):
            ctx.save_for_backward(gate_, up)
            return triton_swiglu.swiglu(gate_, up)

        @staticmethod
        def backward(ctx, g):
            gate_, up = ctx.saved_tensors
            with torch.enable_grad():
                a, b = gate_.detach().requires_grad_(), up.detach().requires_grad_()
                dg, du = torch.autograd.grad(triton_swiglu.swiglu(a, b), (a, b), g)
            return du, dg

    def swiglu_bwd(i):
        gate_, up = i["gu"].chunk(2, dim=-1)
        y = _SwappedGrads.apply(gate_, up)
        return {"out": y.detach(), "grad_gu": torch.autograd.grad(y, i["gu"], i["cot"])[0]}

    def moe_ulp(i):
        out = SPECS["moe_permute"].candidate(i)
        out["grad_x"] = torch.nextafter(out["grad_x"], torch.full_like(out["grad_x"], torch.inf))
        return out

    def ce_no_z(i):
        out = fused_ce.fused_head(i["h"], i["w"], i["y"], "triton", z_loss_weight=0.0, chunk_size=i["chunk"])
        gh, gw = torch.autograd.grad(out.loss, (i["h"], i["w"]))
        return {"loss": out.loss.detach(), "ce_sum": out.ce_sum, "entropy_sum": out.entropy_sum,
                "grad_h": gh, "grad_w": gw}

    return {"rope": rope_sign, "swiglu": swiglu_bwd, "moe_permute": moe_ulp, "fused_ce": ce_no_z}


@pytest.mark.parametrize("name", list(_mutants()))
def test_gate_refuses_a_wrong_kernel(name, gates):
    """Mutation check: the gate records a failure for a wrong kernel and "triton" is then refused by name."""
    rec = gate.run_gate(SPECS[name], DEV, candidate=_mutants()[name])
    assert not rec["passed"]
    assert json.loads(gate.record_path(name, rec["kind"]).read_text())["passed"] is False
    if DEV.type == "cpu":
        with pytest.raises(select.KernelGateError, match="the gate failed"):
            select.resolve(name, "triton", DEV)


def test_moe_permute_is_deterministic_and_exact_in_half_precision():
    """fp16 (bf16 on a GPU): the fixed-order fold rounds after every add exactly as moe.fold_slots does."""
    dtype = torch.bfloat16 if DEV.type == "cuda" else torch.float16
    g = torch.Generator().manual_seed(5)
    x = torch.randn(13, 40, generator=g).to(DEV, dtype).requires_grad_()
    ids = torch.stack([torch.randperm(7, generator=g)[:3] for _ in range(13)]).to(DEV)
    dp = moe.sort_by_expert(ids, 7)
    cot = torch.randn(39, 40, generator=g).to(DEV, dtype)
    runs = [torch.autograd.grad(triton_moe.permute(x, dp.order, dp.inverse, 3), x, cot)[0] for _ in range(2)]
    want = torch.autograd.grad(moe.gather_rows(x, dp), x, cot)[0]
    assert torch.equal(runs[0], runs[1]) and torch.equal(runs[0], want)
