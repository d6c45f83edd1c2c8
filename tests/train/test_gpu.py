"""The training core on CUDA (marked `gpu`, skipped without a GPU): the fused head in bf16 and fp32, adamw8bit's
bit-exact resume with bf16 parameters, and a Trainer run with crash + resume on the device."""

import pytest
import torch

from align.kernels.fused_ce import fused_linear_cross_entropy, reference_linear_cross_entropy

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 3e-2)])
def test_fused_head_on_cuda_matches_full_logits(dtype, tol):
    g = torch.Generator().manual_seed(0)
    h = torch.randn(4096, 512, generator=g).to("cuda", dtype).requires_grad_()
    w = (torch.randn(32768, 512, generator=g) * 0.02).to("cuda", dtype).requires_grad_()
    y = torch.randint(0, 32768, (4096,), generator=g).cuda()
    y[::5] = -100
    out = fused_linear_cross_entropy(h, w, y, chunk_size=1024, z_loss_weight=1e-4)
    out.loss.backward()
    gh, gw = h.grad.float(), w.grad.float()
    h32, w32 = h.detach().float().requires_grad_(), w.detach().float().requires_grad_()
    ref = reference_linear_cross_entropy(h32, w32, y, z_loss_weight=1e-4)
    ref.backward()
    torch.testing.assert_close(out.loss.float(), ref, rtol=tol, atol=tol)
    torch.testing.assert_close(gh, h32.grad, rtol=tol, atol=tol * 1e-2)
    torch.testing.assert_close(gw, w32.grad, rtol=tol, atol=tol * 1e-2)


def test_adamw8bit_bf16_resume_is_bit_exact_on_cuda():
    from align.train.adamw8bit import AdamW8bit

    def run(start, steps, state=None):
        torch.manual_seed(0)
        w = torch.nn.Parameter(torch.randn(300_000, device="cuda").to(torch.bfloat16))
        opt = AdamW8bit([w], lr=1e-3, seed=1)
        if state is not None:
            w.data.copy_(state[0])
            opt.load_state_dict(state[1])
        for i in range(start, start + steps):
            gen = torch.Generator("cuda").manual_seed(i)
            w.grad = torch.randn(w.shape, device="cuda", generator=gen).to(torch.bfloat16)
            opt.step()
        return w.detach().clone(), opt.state_dict()

    w_full, _ = run(0, 4)
    w_res, _ = run(2, 2, run(0, 2))
    assert torch.equal(w_res, w_full)


def test_trainer_crash_and_resume_on_cuda(tmp_path):
    from train_helpers import assert_bitwise_equal, build_sft, weights

    full = build_sft(tmp_path / "full", max_steps=4, checkpoint_every=2)
    assert full.fit() == 0
    assert next(full.module.model.parameters()).is_cuda

    def crash(module, batch, info, count=[0]):
        count[0] += 1
        if count[0] == 6:
            raise RuntimeError("injected")

    with pytest.raises(RuntimeError, match="injected"):
        build_sft(tmp_path / "cut", max_steps=4, checkpoint_every=2, fault=crash).fit()
    resumed = build_sft(tmp_path / "cut", max_steps=4, checkpoint_every=2)
    assert resumed.fit() == 0
    assert_bitwise_equal(weights(full.module), weights(resumed.module))
