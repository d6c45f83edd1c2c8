"""AdamW with its fp32 state in host memory (`optimizer.name = "offload_adamw"`): what lets 7B full fine-tuning fit.

Per parameter (under FSDP2: per local shard, every rank offloads its own) the host holds three fp32 tensors, the
master weights and both moments (12 B per parameter, pinned when the parameter lives on a CUDA device so the copies
are asynchronous DMA). The device keeps only the parameter in the model's dtype (bf16 for a 7B run: 2 B) and its
gradient. A step walks each parameter in flat chunks of at most `chunk_numel` elements through two fixed host
staging slots (double-buffered: the host -> device copy of chunk i runs on a side stream while chunk i+1's gradient
comes down and the host updates it), so the staging memory is bounded by the chunk size, never by the largest
tensor. NOTE: the gradient's device -> host copy is not prefetched ahead of the update; on a GPU that copy and the
host kernel are the step's cost (bench/offload_adamw.py measures it).

The host update is torch's fused AdamW kernel on the fp32 master chunk (the same CPU kernel `optimizer.name =
"adamw"` runs on a CPU); AdamW is element-wise, so chunking changes no bit. The result goes back to the device
rounded to nearest in the parameter's dtype: the fp32 master carries the small updates bf16 would lose, which is why
no stochastic rounding is needed (adamw8bit has no master and needs it).

Gradient clipping is not done here: the TrainModule clips every optimizer the same way (align.train.grad_norm) before
`step`. `state_dict` holds the host tensors as they are (fp32, on the CPU) and `load_state_dict` puts them back
without torch's cast to the parameter's dtype and device (which would round the master to bf16 and move 12 B per
parameter onto the GPU): a resumed run is bitwise the uninterrupted one. The state follows this rank's shard, so a
state saved under another world size is refused.

On a CPU the "host" and the "device" are the same memory and the copies are plain synchronous copies: the same code
path runs, which is what the tests prove (tests/train/test_offload_adamw.py)."""

from __future__ import annotations

from collections import defaultdict

import torch

from align.train.rank_state import RankShardState
from align.utils.dist import rank, world_size

STATE_KEYS = ("master", "exp_avg", "exp_avg_sq")  # fp32 host tensors in the local shard's shape
VECTOR_ALIGN = 64  # chunk sizes are rounded up to a multiple of this (see __init__)
DEFAULT_CHUNK_NUMEL = 1 << 24  # 16 Mi elements: 64 MiB fp32 per staging slot, two slots


def _local(t: torch.Tensor) -> torch.Tensor:
    """The local shard of a DTensor (a view: writes land in the parameter), or the tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def _flat(t: torch.Tensor, what: str) -> torch.Tensor:
    if not t.is_contiguous():
        raise ValueError(f"offload_adamw: {what} of shape {tuple(t.shape)} is not contiguous; cannot stream it")
    return t.view(-1)


class _Staging:
    """Two host slots, reused for every chunk of every parameter; a slot's buffers are made on first use (a CPU run
    with fp32 gradients needs none). On CUDA the buffers are pinned and a slot carries an event marking when the
    device has finished reading its last host -> device copy."""

    def __init__(self, chunk_numel: int, pinned: bool):
        self.chunk_numel = chunk_numel
        self.pinned = pinned
        self.slots: list[dict] = [{"event": None}, {"event": None}]

    def slot(self, i: int) -> dict:
        return self.slots[i % 2]

    def buffer(self, slot: dict, key: str, dtype: torch.dtype, n: int) -> torch.Tensor:
        """The first `n` elements of the slot's `key` buffer in `dtype` (remade if a later tensor has another)."""
        buf = slot.get(key)
        if buf is None or buf.dtype != dtype:
            buf = slot[key] = torch.empty(self.chunk_numel, dtype=dtype, pin_memory=self.pinned)
        return buf[:n]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for s in self.slots for k, t in s.items() if k != "event")


class OffloadAdamW(RankShardState, torch.optim.Optimizer):
    local_shard_state = True  # state tensors are plain host tensors of the local shard, never DTensors
    state_name = "offload_adamw"

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, chunk_numel: int = DEFAULT_CHUNK_NUMEL):
        if not lr >= 0 or not eps >= 0 or not all(0.0 <= b < 1.0 for b in betas) or weight_decay < 0:
            raise ValueError(f"invalid OffloadAdamW hyper-parameters lr={lr} betas={betas} eps={eps} "
                             f"weight_decay={weight_decay}")
        if chunk_numel < 1:
            raise ValueError(f"offload_adamw chunk_numel must be >= 1, got {chunk_numel}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))
        # NOTE: a multiple of the kernel's vector width keeps every chunk start on a vector boundary; the kernel's
        # scalar tail rounds differently (a 37-element chunk changed bits), 64 covers every CPU vector width
        self.chunk_numel = -(-chunk_numel // VECTOR_ALIGN) * VECTOR_ALIGN
        self.world = world_size()
        self.rank = rank()
        on_cuda = any(_local(p).device.type == "cuda" for g in self.param_groups for p in g["params"])
        self.pinned = on_cuda and torch.cuda.is_available()
        self._staging = _Staging(chunk_numel, self.pinned)
        self._streams: dict = {}  # CUDA: one side stream per device for the host -> device copies
        self._h2d = None  # the side stream this step has used (joined back in _drain)

    # ------------------------------------------------------------------------------------------- state
    def _host_copy(self, t: torch.Tensor) -> torch.Tensor:
        """An fp32 host copy of `t` (pinned when the parameters are on CUDA)."""
        out = torch.empty(t.shape, dtype=torch.float32, pin_memory=self.pinned)
        out.copy_(t)
        return out

    def _init_state(self, p_local: torch.Tensor) -> dict:
        master = self._host_copy(p_local.detach())
        zeros = lambda: torch.zeros(p_local.shape, dtype=torch.float32, pin_memory=self.pinned)  # noqa: E731
        # step as an fp32 scalar on the CPU, as torch's fused AdamW keeps it (its kernel reads it there)
        return {"step": torch.zeros((), dtype=torch.float32), "master": master, "exp_avg": zeros(),
                "exp_avg_sq": zeros()}

    def host_bytes(self) -> int:
        """Host bytes of the state (master + moments + step) and the staging slots."""
        state = sum(v.numel() * v.element_size() for s in self.state.values() for v in s.values()
                    if torch.is_tensor(v))
        return state + self._staging.nbytes()

    # ------------------------------------------------------------------------------------------- step
    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        chunk = 0  # global chunk counter: which staging slot is next
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                p_local, g_local = _local(p), _local(p.grad)
                state = self.state[p]
                if not state:
                    state.update(self._init_state(p_local))
                if state["master"].shape != p_local.shape:
                    raise ValueError(f"offload_adamw: state shape {tuple(state['master'].shape)} does not match the "
                                     f"local parameter {tuple(p_local.shape)}")
                state["step"] += 1
                chunk = self._step_param(p_local, g_local, state, group, chunk)
        self._drain()
        return loss

    def _step_param(self, p: torch.Tensor, g: torch.Tensor, state: dict, group: dict, chunk: int) -> int:
        p_flat, g_flat = _flat(p, "parameter"), _flat(g, "gradient")
        master, m, v = (_flat(state[k], k) for k in STATE_KEYS)
        n = p_flat.numel()
        beta1, beta2 = group["betas"]
        for start in range(0, n, self.chunk_numel):
            end = min(start + self.chunk_numel, n)
            slot = self._staging.slot(chunk)
            chunk += 1
            g32 = self._grad_to_host(g_flat[start:end], slot)
            torch._fused_adamw_([master[start:end]], [g32], [m[start:end]], [v[start:end]], [], [state["step"]],
                                amsgrad=False, lr=float(group["lr"]), beta1=beta1, beta2=beta2,
                                weight_decay=group["weight_decay"], eps=group["eps"], maximize=False)
            self._param_to_device(master[start:end], p_flat[start:end], slot)
        return chunk

    def _grad_to_host(self, g: torch.Tensor, slot: dict) -> torch.Tensor:
        """The gradient chunk as fp32 on the host. A host fp32 gradient is used in place (no copy)."""
        if g.device.type == "cpu" and g.dtype == torch.float32:
            return g
        if g.device.type == "cuda":  # the gradient's own dtype crosses the bus (half the bytes of fp32 for bf16)
            staged = self._staging.buffer(slot, "grad", g.dtype, g.numel())
            staged.copy_(g, non_blocking=self.pinned)
            # the host reads it next; the compute stream holds only these copies (the writes back run on _h2d)
            torch.cuda.current_stream(g.device).synchronize()
            g = staged
            if g.dtype == torch.float32:
                return g
        g32 = self._staging.buffer(slot, "grad32", torch.float32, g.numel())
        g32.copy_(g)
        return g32

    def _param_to_device(self, master: torch.Tensor, p: torch.Tensor, slot: dict) -> None:
        """Write the updated master chunk into the parameter, rounded to nearest in the parameter's dtype."""
        if p.device.type == "cpu":
            p.copy_(master)
            return
        if slot["event"] is not None:
            slot["event"].synchronize()  # the device has read this slot's previous chunk
        staged = self._staging.buffer(slot, "param", p.dtype, master.numel())
        staged.copy_(master)  # the host rounds to the parameter's dtype: half the bytes cross the bus
        h2d = self._h2d_stream(p.device)
        with torch.cuda.stream(h2d):  # beside the next chunk's device -> host copy on the compute stream
            p.copy_(staged, non_blocking=True)
            slot["event"] = torch.cuda.Event()
            slot["event"].record(h2d)

    def _h2d_stream(self, dev: torch.device):
        if self._h2d is None:  # first write back of this step
            if dev not in self._streams:
                self._streams[dev] = torch.cuda.Stream(dev)
            self._h2d = self._streams[dev]
            self._h2d.wait_stream(torch.cuda.current_stream(dev))  # after whatever last touched the parameters
        return self._h2d

    def _drain(self) -> None:
        """Every write back has landed before the host slots are reused or the next forward reads a parameter."""
        for slot in self._staging.slots:
            if slot["event"] is not None:
                slot["event"].synchronize()
                slot["event"] = None
        if self._h2d is not None:
            torch.cuda.current_stream(self._h2d.device).wait_stream(self._h2d)
            self._h2d = None

    # ------------------------------------------------------------------------------------------- checkpoints
    def load_state_dict(self, state_dict: dict) -> None:
        """Load this rank's saved state without torch's cast to the parameters' dtype and device (module doc)."""
        state_dict = self.checked_state(state_dict)
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups) or any(
                len(a["params"]) != len(b["params"]) for a, b in zip(saved_groups, self.param_groups)):
            raise ValueError("offload_adamw state has different parameter groups than this optimizer")
        by_id = {pid: p for saved, group in zip(saved_groups, self.param_groups)
                 for pid, p in zip(saved["params"], group["params"])}
        state: defaultdict = defaultdict(dict)
        for pid, saved in state_dict["state"].items():
            p = by_id[pid]
            shape = _local(p).shape
            for key in STATE_KEYS:
                if saved[key].shape != shape or saved[key].dtype != torch.float32:
                    raise ValueError(f"offload_adamw state {key!r} of parameter {pid} is {saved[key].dtype} "
                                     f"{tuple(saved[key].shape)}; this rank's shard needs float32 {tuple(shape)}")
            state[p] = {"step": saved["step"].to(torch.float32, copy=True),
                        **{k: self._host_copy(saved[k]) for k in STATE_KEYS}}
        self.state = state
        for saved, group in zip(saved_groups, self.param_groups):
            group.update({k: v for k, v in saved.items() if k != "params"})
