"""Block-wise 8-bit quantisation with a dynamic-exponent codebook (the storage format of `adamw8bit`).

Each block of `BLOCK` consecutive values is scaled by its absolute maximum into [-1, 1] and each value is stored as
the uint8 index of the nearest codebook entry. The codebook is "dynamic" (Dettmers, "8-bit approximations for
parallelism in deep learning", 2016; "8-bit optimizers via block-wise quantization", 2021): its entries cover seven
decades, 1e-6 .. 1, with fewer linear steps in the small decades and more in the large ones, so both the many tiny
Adam moments and the few large ones keep about two significant digits. Storage: 1 byte per value plus one fp32 per
block (4 / 2048 bytes per value).

Rounding is to the nearest entry (round-half-down at exact midpoints via `searchsorted`), deterministic, so the same
fp32 state quantises to the same bytes on every run."""

from __future__ import annotations

import torch

BLOCK = 2048
_DECADES = 7


def dynamic_codebook(signed: bool) -> torch.Tensor:
    """256 sorted fp32 values in [-1, 1] (signed) or [0, 1] (unsigned), including 0 and 1.

    Decade i (values ~ 1e-6 * 10^i) gets 2^i linear steps (signed, plus their negatives) or 2^(i+1) (unsigned),
    taken as the midpoints of a 0.1..1 grid so no two decades share a value: 127 (x2) + 0 + 1 = 256, or 254 + 2.
    The signed book trades its smallest positive entry for -1, so a block's extremum is exact whatever its sign."""
    values = [0.0, 1.0]
    for i in range(_DECADES):
        steps = 2 ** i if signed else 2 ** (i + 1)
        grid = torch.linspace(0.1, 1.0, steps + 1, dtype=torch.float64)
        mids = ((grid[:-1] + grid[1:]) / 2 * 10.0 ** (i - _DECADES + 1)).tolist()
        values += mids
        if signed:
            values += [-m for m in mids]
    if signed:
        values.remove(min(v for v in values if v > 0))
        values.append(-1.0)
    code = torch.tensor(sorted(values), dtype=torch.float32)
    if code.numel() != 256:  # NOTE: a wrong count would silently wrap indices in uint8
        raise AssertionError(f"codebook has {code.numel()} entries, expected 256")
    return code


class Codebook:
    """A codebook with its decision boundaries, cached per device."""

    def __init__(self, signed: bool):
        self.signed = signed
        self._cpu = dynamic_codebook(signed)
        self._by_device: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def tables(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if device not in self._by_device:
            code = self._cpu.to(device)
            self._by_device[device] = (code, (code[1:] + code[:-1]) / 2)  # values (256,), boundaries (255,)
        return self._by_device[device]


SIGNED = Codebook(signed=True)
UNSIGNED = Codebook(signed=False)


def n_blocks(numel: int) -> int:
    return (numel + BLOCK - 1) // BLOCK


def _blocked(x: torch.Tensor) -> torch.Tensor:
    """fp32 view of flat `x` as (n_blocks, BLOCK), zero-padded (padding never affects a block's absmax)."""
    flat = x.reshape(-1).float()
    pad = n_blocks(flat.numel()) * BLOCK - flat.numel()
    if pad:
        flat = torch.cat([flat, flat.new_zeros(pad)])
    return flat.view(-1, BLOCK)


def quantize(x: torch.Tensor, book: Codebook, out_q: torch.Tensor, out_absmax: torch.Tensor) -> None:
    """Write the 8-bit form of `x` into `out_q` (uint8, numel(x)) and `out_absmax` (fp32, n_blocks)."""
    code, bounds = book.tables(x.device)
    blocks = _blocked(x)  # (nb, BLOCK)
    absmax = blocks.abs().amax(dim=1)  # (nb,)
    scale = torch.where(absmax > 0, absmax, torch.ones_like(absmax))
    idx = torch.searchsorted(bounds, (blocks / scale[:, None]).contiguous())  # (nb, BLOCK) in [0, 255]
    out_q.copy_(idx.reshape(-1)[: out_q.numel()].to(torch.uint8))
    out_absmax.copy_(absmax)


def dequantize(q: torch.Tensor, absmax: torch.Tensor, book: Codebook, shape: torch.Size) -> torch.Tensor:
    """fp32 values of `shape` from their 8-bit form."""
    code, _ = book.tables(q.device)
    numel = q.numel()
    vals = code[q.long()]  # (numel,)
    pad = n_blocks(numel) * BLOCK - numel
    if pad:
        vals = torch.cat([vals, vals.new_zeros(pad)])
    return (vals.view(-1, BLOCK) * absmax[:, None]).reshape(-1)[:numel].view(shape)


def stochastic_round_to_bf16(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Round fp32 `x` to bf16 up or down with probability proportional to proximity (unbiased in expectation).

    A uniform 16-bit integer is added to the fp32 bit pattern and the low 16 bits are dropped: the carry reaches the
    kept bits with probability (dropped bits) / 2^16. Without it, updates smaller than half a bf16 ulp of the weight
    (lr * update << 2^-8 * |w|) would round away on every step and bf16 weights would stop learning."""
    bits = x.float().contiguous().view(torch.int32)
    noise = torch.randint(0, 1 << 16, bits.shape, dtype=torch.int32, device=x.device, generator=generator)
    rounded = (bits + noise) & -65536  # -65536 == 0xFFFF0000 as int32: keep sign, exponent, 7 mantissa bits
    return rounded.view(torch.float32).to(torch.bfloat16)  # exact: the low 16 bits are already zero
