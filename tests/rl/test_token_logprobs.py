"""align.rl.token_logprobs: the chunked tempered head equals the plain full-logits formula (values, entropies,
gradients), and completion positions line up with the tokens they predict."""

import pytest
import torch

from align.model import MistralConfig, MistralForCausalLM
from align.kernels import ce_rows
from align.rl.fused_objective import fused_token_objective
from align.rl.token_logprobs import completion_logprobs, completion_positions, tempered_token_logprobs


def plain(hidden, weight, targets, temperature):
    z = (hidden @ weight.t()).double() / temperature  # (N, V)
    logp = z.log_softmax(-1)
    return logp.gather(1, targets[:, None]).squeeze(1), -(logp.exp() * logp).sum(-1)


@pytest.mark.parametrize("temperature,chunk", [(1.0, 3), (0.7, 4), (1.3, 100)])
def test_values_entropy_and_gradients_match_full_logits(temperature, chunk):
    gen = torch.Generator().manual_seed(0)
    h = torch.randn(10, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    w = torch.randn(50, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    y = torch.randint(0, 50, (10,), generator=gen)
    g = torch.randn(10, generator=gen, dtype=torch.float64)
    logp, ent = tempered_token_logprobs(h, w, y, temperature, chunk)
    (logp * g).sum().backward()
    grads = h.grad.clone(), w.grad.clone()
    h.grad = w.grad = None
    ref_logp, ref_ent = plain(h, w, y, temperature)
    (ref_logp * g).sum().backward()
    assert torch.allclose(logp, ref_logp, atol=1e-12) and torch.allclose(ent, ref_ent, atol=1e-12)
    assert torch.allclose(grads[0], h.grad, atol=1e-12) and torch.allclose(grads[1], w.grad, atol=1e-12)
    assert not ent.requires_grad


def test_gradcheck():
    gen = torch.Generator().manual_seed(1)
    h = torch.randn(5, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    w = torch.randn(7, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    y = torch.randint(0, 7, (5,), generator=gen)
    assert torch.autograd.gradcheck(lambda a, b: tempered_token_logprobs(a, b, y, 0.8, 2)[0], (h, w))


def test_bad_inputs_are_refused():
    h, w = torch.zeros(2, 4), torch.zeros(6, 4)
    with pytest.raises(ValueError, match="temperature"):
        tempered_token_logprobs(h, w, torch.tensor([0, 1]), 0.0)
    with pytest.raises(ValueError, match=r"\[0, 6\)"):
        tempered_token_logprobs(h, w, torch.tensor([0, 6]), 1.0)


def test_completion_logprobs_score_each_token_after_its_own_prefix():
    torch.manual_seed(0)
    cfg = MistralConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64, pad_token_id=0)
    model = MistralForCausalLM(cfg).double()
    rows = [([5, 6, 7], [8, 9]), ([10, 11], [12, 13, 14])]  # (prompt, completion)
    ids = torch.zeros(2, 5, dtype=torch.long)
    comp = torch.zeros(2, 3, dtype=torch.long)
    mask = torch.zeros(2, 3)
    for b, (p, c) in enumerate(rows):
        ids[b, :len(p) + len(c)] = torch.tensor(p + c)
        comp[b, :len(c)] = torch.tensor(c)
        mask[b, :len(c)] = 1
    batch = {"input_ids": ids, "completion_start": torch.tensor([3, 2]), "completion_ids": comp,
             "completion_mask": mask}
    flat, _ = completion_positions(batch)
    assert flat.tolist() == [2, 3, 6, 7, 8]  # row 0: positions 2, 3; row 1 (offset 5): positions 1, 2, 3
    logp, ent = completion_logprobs(model, batch, temperature=0.9, chunk_size=2)
    for b, (p, c) in enumerate(rows):  # each row alone, unpadded, full logits
        z = model(torch.tensor([p + c])).double()[0] / 0.9
        want = z.log_softmax(-1)[len(p) - 1:len(p) + len(c) - 1].gather(1, torch.tensor(c)[:, None]).squeeze(1)
        assert torch.allclose(logp[b, :len(c)], want, atol=1e-10)
    assert (logp[0, 2] == 0) and (ent[0, 2] == 0)  # padding positions are zero


needs_native = pytest.mark.skipif(not ce_rows.available(), reason="no C compiler to build csrc/ce_rows.c")


@needs_native
@pytest.mark.parametrize("temperature,chunk", [(1.0, 3), (0.7, 4), (1.3, 100)])
def test_c_rows_match_full_logits(temperature, chunk):
    """The head with its row passes in C (fp32 only) against the float64 formula: values, entropies, gradients."""
    gen = torch.Generator().manual_seed(2)
    h = torch.randn(10, 8, generator=gen, requires_grad=True)
    w = torch.randn(50, 8, generator=gen, requires_grad=True)
    y = torch.randint(0, 50, (10,), generator=gen)
    g = torch.randn(10, generator=gen)
    logp, ent = tempered_token_logprobs(h, w, y, temperature, chunk, native=True)
    (logp * g).sum().backward()
    grads = h.grad.clone(), w.grad.clone()
    h64, w64 = h.detach().double().requires_grad_(True), w.detach().double().requires_grad_(True)
    ref_logp, ref_ent = plain(h64, w64, y, temperature)
    (ref_logp * g.double()).sum().backward()
    assert torch.allclose(logp.double(), ref_logp, atol=1e-5) and torch.allclose(ent.double(), ref_ent, atol=1e-5)
    assert torch.allclose(grads[0].double(), h64.grad, atol=1e-5) and torch.allclose(grads[1].double(), w64.grad,
                                                                                      atol=1e-5)


@needs_native
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_fused_objective_with_c_rows_gives_the_scoring_heads_bits(temperature):
    """pi_old scored by the unfused head and the fused training forward must agree exactly on the same weights (rho
    and the first window's ratio are exact); the fused gradient, which skips the rows whose g is 0, equals the
    unfused one's."""
    gen = torch.Generator().manual_seed(3)
    h = torch.randn(40, 16, generator=gen, requires_grad=True)
    w = torch.randn(300, 16, generator=gen, requires_grad=True)
    y = torch.randint(0, 300, (40,), generator=gen)
    adv = torch.randn(40, generator=gen)
    adv[::3] = 0.0  # tokens without a gradient: left out of the fused head's two gradient GEMMs

    def objective(x, rows):
        return -(x - x.detach()).exp() * adv[rows]

    total, logp, ent = fused_token_objective(h, w, y, temperature, objective, 16, native=True)
    total.backward()
    fused = h.grad.clone(), w.grad.clone()
    h.grad = w.grad = None
    plain_logp, plain_ent = tempered_token_logprobs(h, w, y, temperature, 16, native=True)
    (-(plain_logp - plain_logp.detach()).exp() * adv).sum().backward()
    assert torch.equal(logp, plain_logp.detach()) and torch.equal(ent, plain_ent)
    assert torch.equal(fused[0][::3], torch.zeros_like(fused[0][::3]))
    assert torch.allclose(fused[0], h.grad, rtol=1e-5, atol=1e-6) and torch.allclose(fused[1], w.grad, rtol=1e-5,
                                                                                      atol=1e-6)
    torch_logp, _ = tempered_token_logprobs(h, w, y, temperature, 16)
    assert torch.allclose(logp, torch_logp.detach(), atol=1e-5)  # another rounding, the same values
