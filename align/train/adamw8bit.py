"""AdamW with block-wise 8-bit moments (`optimizer.name = "adamw8bit"`), torch only.

State per parameter: the first moment in the signed dynamic codebook and the second in the unsigned one, one uint8
per element plus one fp32 absmax per 2048-element block (quant8.py): 2.004 bytes per parameter instead of fp32
AdamW's 8. Tensors smaller than `min_8bit_numel` (norm weights, biases) keep fp32 moments: they are a rounding error
of the memory and the most sensitive to quantisation. Each step dequantises, applies the exact AdamW update in fp32
(decoupled weight decay, bias correction), and requantises.

Parameters held in bf16 receive the fp32 result by stochastic rounding (quant8.stochastic_round_to_bf16). Its noise
comes from a generator seeded by (seed, step, parameter index, rank), not from a stateful stream, so a resumed run
draws the same bits as an uninterrupted one without saving generator state.

FSDP2: a parameter may be a DTensor; the update is element-wise, so each rank steps its local shard and quantises it
in its own blocks. The state therefore depends on the sharding: `load_state_dict` refuses a state saved under a
different world size. Gradient clipping is not done here: the TrainModule clips every optimizer the same way."""

from __future__ import annotations

import torch

from align.train.rank_state import RankShardState
from align.train.quant8 import SIGNED, UNSIGNED, dequantize, n_blocks, quantize, stochastic_round_to_bf16

_SEED_MIX = 0x9E3779B97F4A7C15  # odd 64-bit constant (golden ratio) to spread (step, index) over the seed space


def _local(t: torch.Tensor) -> torch.Tensor:
    """The local shard of a DTensor (a view: writes land in the parameter), or the tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def _world() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class AdamW8bit(RankShardState, torch.optim.Optimizer):
    local_shard_state = True  # state tensors are plain local-shard tensors, never DTensors
    state_name = "adamw8bit"

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, min_8bit_numel: int = 4096, seed: int = 0):
        if not lr >= 0 or not eps >= 0 or not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"invalid AdamW8bit hyper-parameters lr={lr} betas={betas} eps={eps}")
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay)
        super().__init__(params, defaults)
        self.min_8bit_numel = min_8bit_numel
        self.seed = seed
        self.rank, self.world = _world()

    def _init_state(self, p_local: torch.Tensor) -> dict:
        n = p_local.numel()
        if n < self.min_8bit_numel:
            return {"step": 0, "m": torch.zeros_like(p_local, dtype=torch.float32),
                    "v": torch.zeros_like(p_local, dtype=torch.float32)}
        dev = p_local.device
        return {"step": 0, "m_q": torch.zeros(n, dtype=torch.uint8, device=dev),
                "m_absmax": torch.zeros(n_blocks(n), dtype=torch.float32, device=dev),
                "v_q": torch.zeros(n, dtype=torch.uint8, device=dev),
                "v_absmax": torch.zeros(n_blocks(n), dtype=torch.float32, device=dev)}

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        index = 0
        for group in self.param_groups:
            for p in group["params"]:
                index += 1
                if p.grad is None:
                    continue
                p_local, g = _local(p), _local(p.grad).float()
                state = self.state[p]
                if not state:
                    state.update(self._init_state(p_local))
                state["step"] += 1
                self._update(p_local, g, state, group, index)
        return loss

    def _update(self, p: torch.Tensor, g: torch.Tensor, state: dict, group: dict, index: int) -> None:
        beta1, beta2 = group["betas"]
        step = state["step"]
        quantized = "m_q" in state
        if quantized:
            m = dequantize(state["m_q"], state["m_absmax"], SIGNED, p.shape)
            v = dequantize(state["v_q"], state["v_absmax"], UNSIGNED, p.shape)
        else:
            m, v = state["m"], state["v"]
        m.mul_(beta1).add_(g, alpha=1.0 - beta1)
        v.mul_(beta2).addcmul_(g, g, value=1.0 - beta2)
        denom = (v / (1.0 - beta2 ** step)).sqrt_().add_(group["eps"])
        w = p.float()
        if p.dtype == torch.float32:
            w = p  # update in place, no copy
        w.mul_(1.0 - group["lr"] * group["weight_decay"])
        w.addcdiv_(m, denom, value=-group["lr"] / (1.0 - beta1 ** step))
        if p.dtype == torch.bfloat16:
            p.copy_(stochastic_round_to_bf16(w, self._generator(p.device, step, index)))
        elif w is not p:
            p.copy_(w)
        if quantized:
            quantize(m, SIGNED, state["m_q"], state["m_absmax"])
            quantize(v, UNSIGNED, state["v_q"], state["v_absmax"])

    def _generator(self, device: torch.device, step: int, index: int) -> torch.Generator:
        seed = (self.seed * _SEED_MIX + step * 1_000_003 + index * 7_919 + self.rank * 104_729) % (2 ** 63)
        gen = torch.Generator(device=device)
        gen.manual_seed(seed)
        return gen

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(self.checked_state(state_dict))
        # NOTE: torch casts floating state to the parameter's dtype on load; for bf16 parameters that would round
        # the fp32 absmax and moments and break bit-exact resume. Put the saved tensors back as they were.
        for group, saved_group in zip(self.param_groups, state_dict["param_groups"]):
            for p, pid in zip(group["params"], saved_group["params"]):
                for key, value in state_dict["state"].get(pid, {}).items():
                    if torch.is_tensor(value):
                        self.state[p][key] = value.to(device=_local(p).device, copy=True)


def state_bytes(opt: torch.optim.Optimizer) -> int:
    """Bytes held by an optimizer's state tensors (to report B/param)."""
    return sum(v.numel() * v.element_size() for s in opt.state.values() for v in s.values() if torch.is_tensor(v))
