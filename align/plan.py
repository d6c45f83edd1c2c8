"""The memory plan of a profile's GPU run: per-rank bytes before anything is launched.

    python -m align.plan --profile mistral7b --gpus 4 --gpu-mem 80 [--optimizer NAME] [--host-mem GiB] [--json]
    python -m align.plan --profile mistral7b --sweep        (markdown: 1, 2, 4, 8 GPUs of 24, 80, 141 GiB)

Reads the profile's stage configs (`configs/<profile>/sft.toml`, and `grpo.toml` when the profile has one) and the
architecture: the config.json of sft.toml's `[model].base` when that snapshot is on this host, else
`configs/<profile>/plan.toml`'s `[model]` (the base checkpoint's config.json values, `model_type` naming the family
registered in align.model.family: "mistral" (also when absent, as for a config.json), "llama", "qwen2", "qwen3",
"olmoe"; read by that family's config.json reader, with its defaults and refusals), else sft.toml's `[model.init]`
(a from-scratch profile, as its `[model] family`, or OLMoE with its `[model.moe]`). Parameter shapes come from the
config's family's model built on the meta device (no memory), so every tensor of the real model is counted (Qwen 2's
q/k/v biases, Qwen 3's q/k norms, OLMoE's router and experts), with FSDP2's per-rank shard of dim 0 (rank 0's, the
largest: ceil(rows / N)). Activations per family: the dense block, what the attention normalises (Qwen 3 per head,
OLMoE per projection, as the attention module's `qk_norm` says), and for a family whose `mlp` is "sparse" the MoE
block and the router statistics in place of the dense MLP; Qwen 2's biases and Llama 3's scaled RoPE save nothing
more. Routing is dropless, so how tokens split over the experts changes no saved byte (N k rows in all). Not
modelled: expert parallelism (`[parallel] expert_parallel` > 1 is refused: its shards stay out of FSDP2), the grouped
expert backend (no stage selects it; it would save E int32 offsets more per block), the Triton MoE permute.

Terms, per rank (b = bytes of the parameter dtype, c = of the compute dtype, N tokens of a micro-batch, D hidden, I
intermediate, H / K query / key-value heads of Dh, L layers, V vocabulary; the tensors the code holds, by name):
  weights, gradients     sum of the local shards x b (FSDP2 reduces gradients into the shard, in the param dtype);
                         without `sync_every_micro_batch` a window of several micro-batches also holds the unsharded
                         gradients (every parameter x c) until its last micro-batch
  optimizer state        adamw: exp_avg + exp_avg_sq in the parameter dtype (2 b per element) on the device, one fp32
                         `step` per tensor on the host; adamw8bit: uint8 moments + fp32 absmax per 2048 (2 B + 8 B /
                         2048 per element; tensors under min_8bit_numel keep fp32 moments, 8 B) on the device;
                         offload_adamw: nothing on the device, fp32 master + moments (12 B per element) + a step per
                         tensor + two staging slots of chunk_numel elements (gradient and parameter dtype, and an
                         fp32 gradient unless it is fp32) on the host (align.train.offload_adamw)
  activations            saved for backward per decoder block (the torch path of align.model.mistral, measured with
                         saved-tensor hooks in tests/train/test_plan.py):
                           A = N (8 D + 8 + 4 c D + 2 c H Dh + 2 c K Dh + 4 H + 4 c I)
                         (two RMSNorms: fp32 input copy, rsqrt, normed + scaled outputs; q after RoPE, k, v, the
                         attention output and its fp32 log-sum-exp; gate, silu, up and their product); a config
                         with per-head q/k norms (`qk_norm` "head", Qwen 3) adds N (H + K) (4 Dh + 4 + c Dh) (each
                         norm's fp32 input copy, rsqrt per head and normed output), norms over the whole q and k
                         projections (OLMoE) N ((H + K) Dh (4 + c) + 8). A sparse MLP (E experts, top-k k, I each
                         expert's width) replaces 4 c I by N (4 E + 16 k + c k (2 D + 4 I + 1)) (fp32 routing
                         probabilities, top-k ids and the inverse permutation, the sorted rows, gate_up, silu and
                         product per token-slot, the unsorted outputs and the top-k weights; a router in fp32 on
                         bf16 activations: + N (4 - c) D + 4 E D), and the MoE objective's router statistics hold
                         N (8 E + 4) per layer (fp32 logits, probabilities, log-sum-exp) and the fp32 token mask
                         (4 N) outside the blocks. Plus once the
                         input ids (8 N) and the RoPE tables (2 c N Dh). Without checkpointing: L A. With activation
                         checkpointing: L c N D (each block's input) stored, plus one block recomputed in backward (A).
                         Causal attention without a mask tensor (full or packed rows) is assumed; a padded batch's
                         mask adds B T^2 c per block.
  head                   the fused linear cross-entropy (align.kernels.fused_ce) saves the final norm's tensors
                         (4 N D + 4 N + c N D), the label rows' index and gradient (N (8 + c D)) and the fp32 weight
                         gradient (4 V D); while it runs it also holds the [chunk, V] fp32 logits workspace, one
                         [chunk, V] gradient in c and one V x D product in c and fp32
  fsdp buffers           two gathered decoder blocks in c (the current one and the prefetched one), the root's
                         gathered embedding / head / final norm in c, and one block's unsharded gradient in the reduce
                         dtype (estimates from FSDP2's buffers, not measured here: no GPU)
  engine (GRPO)          the sampler's full copy of the weights in engine_dtype and its KV cache:
                         min(max_num_seqs x ceil(max_model_len / block_size), kv_cache_max_mb / per-block) blocks of
                         2 L block_size K Dh bytes (align.inference.Engine's own sizing)

A stage fits when its device total is at most gpu_mem x (1 - headroom) (the headroom, default 10%, covers the CUDA
context, NCCL buffers, allocator fragmentation and backward's transient gradients of one block) and, with
`--host-mem`, the host bytes of all ranks of the node fit in it. A plan that does not fit is refused: one line on
stderr, exit 83 (PreflightRefused), as the launcher's preflight refuses a host that cannot hold the run."""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from align.config import ConfigError, load_config, read_toml
from align.exceptions import CheckpointError, PreflightRefused
from align.exit_codes import run_with_exit_codes
from align.inference.config import EngineConfig
from align.model import MistralConfig
from align.model.checkpoint import DTYPES
from align.model.config_io import load_hf_config
from align.model.family import family_of_config, family_of_config_dict, scratch_config
from align.model.hf_config import config_from_hf_dict
from align.model.olmoe import olmoe_config
from align.rl.stage_config import GrpoStageConfig
from align.stages.sft import SftStageConfig
from align.train.offload_adamw import DEFAULT_CHUNK_NUMEL, VECTOR_ALIGN
from align.train.parallel import ParallelConfig
from align.train.quant8 import BLOCK

GIB = 2 ** 30
OPTIMIZERS = ("adamw", "adamw8bit", "offload_adamw")
ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Workload:
    """One training stage's shape on the GPUs: what the plan needs from its configs."""

    stage: str
    model: MistralConfig
    param_dtype: str  # the parameters' own dtype ([model] dtype)
    parallel: ParallelConfig
    tokens: int  # tokens of one micro-batch (the bound the loader enforces)
    grad_accum: int
    head_chunk: int  # rows of the fused head's logits chunk
    min_8bit_numel: int = 4096
    engine: EngineConfig | None = None  # a sampler beside the trainer (GRPO)
    engine_dtype: str = "bfloat16"
    router_dtype: str = "activation"  # an MoE model's router linear: "activation" or "fp32" ([model.moe])

    def sharded(self, gpus: int) -> bool:
        """FSDP2 (strategy "fsdp", or "auto" on several ranks); DDP and one process replicate every tensor."""
        try:
            return self.parallel.resolved_strategy(gpus) == "fsdp"
        except ValueError as exc:
            raise ConfigError(f"{self.stage}: {exc}") from exc

    def compute_dtype(self, gpus: int) -> str:
        """FSDP2's mixed-precision policy gathers parameters in parallel.param_dtype; otherwise they compute as held."""
        return self.parallel.param_dtype if self.sharded(gpus) else self.param_dtype


@dataclass
class Plan:
    """Per-rank bytes of one workload on `gpus` ranks, for every optimizer."""

    workload: Workload
    gpus: int
    compute_dtype: str
    terms: dict[str, int] = field(default_factory=dict)  # device bytes independent of the optimizer
    optimizer_device: dict[str, int] = field(default_factory=dict)
    optimizer_host: dict[str, int] = field(default_factory=dict)

    def device_total(self, optimizer: str) -> int:
        ac = self.workload.parallel.activation_checkpointing
        skip = "activations_no_ac" if ac else "activations_ac"
        return sum(v for k, v in self.terms.items() if k != skip) + self.optimizer_device[optimizer]


def _bytes(dtype: str) -> int:
    return DTYPES[dtype].itemsize


@functools.lru_cache(maxsize=8)
def _meta_model(cfg: MistralConfig) -> torch.nn.Module:
    """The config's family's causal LM on the meta device (no memory): its parameters are the real model's. Cached:
    a plan asks for it several times (read only)."""
    with torch.device("meta"):
        return family_of_config(cfg).causal_lm(cfg)


def _qk_norm(cfg: MistralConfig) -> str | None:
    """What the family's attention RMS-normalises before RoPE, as its module says (the attribute the engine reads):
    None, "head" (each q and k head: Qwen 3) or "projection" (the whole q and k projections: OLMoE)."""
    return getattr(_meta_model(cfg).model.layers[0].self_attn, "qk_norm", None)


def param_shapes(cfg: MistralConfig) -> list[tuple[int, ...]]:
    """Every trainable tensor's shape (a tied head counted once; a family's q/k/v biases and q/k norms included)."""
    return [tuple(p.shape) for p in _meta_model(cfg).parameters()]


def shard_numel(shape: tuple[int, ...], gpus: int) -> int:
    """Elements of rank 0's FSDP2 shard (dim 0 split in ceil(rows / N) rows; one rank: the whole tensor)."""
    rows = -(-shape[0] // gpus)
    return rows * math.prod(shape[1:])


def block_numel(cfg: MistralConfig) -> int:
    """Elements of one decoder block (FSDP2's unit), its family's extra parameters included."""
    return sum(p.numel() for p in _meta_model(cfg).model.layers[0].parameters())


def optimizer_bytes(name: str, shards: list[int], param_dtype: str, *, min_8bit_numel: int = 4096,
                    separate_host: bool = True, chunk_numel: int = DEFAULT_CHUNK_NUMEL) -> tuple[int, int]:
    """(device, host) bytes of optimizer `name`'s state over these local shards. `separate_host`: the device is a
    GPU (offload_adamw's staging slots exist only then; on a CPU the step reads and writes the tensors in place)."""
    b = _bytes(param_dtype)
    if name == "adamw":
        return 2 * b * sum(shards), 4 * len(shards)
    if name == "adamw8bit":
        return sum(2 * n + 8 * -(-n // BLOCK) if n >= min_8bit_numel else 8 * n for n in shards), 0
    if name == "offload_adamw":
        host = 12 * sum(shards) + 4 * len(shards)
        if separate_host:
            chunk = -(-min(chunk_numel, max(shards)) // VECTOR_ALIGN) * VECTOR_ALIGN
            host += 2 * chunk * (b + b + (4 if b != 4 else 0))  # per slot: gradient, parameter, fp32 gradient
        return 0, host
    raise ConfigError(f"align.plan: no memory model for optimizer {name!r}; known: {', '.join(OPTIMIZERS)}")


def block_activation_bytes(cfg: MistralConfig, tokens: int, compute_dtype: str,
                           router_dtype: str = "activation") -> int:
    """Bytes one decoder block saves for backward (the formula `A` of the module docstring, with the attention's
    q/k norms and, for a family whose MLP is sparse, the MoE block in place of the dense MLP's 4 c I)."""
    c, n, d = _bytes(compute_dtype), tokens, cfg.hidden_size
    h, k, dh, i = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.intermediate_size
    attention = n * (8 * d + 8 + 4 * c * d + 2 * c * h * dh + 2 * c * k * dh + 4 * h)
    norms = _qk_norm(cfg)  # each norm: its fp32 input copy, a rsqrt per normed row, its normed output
    if norms == "head":
        attention += n * (h + k) * (4 * dh + 4 + c * dh)
    elif norms == "projection":
        attention += n * ((h + k) * dh * (4 + c) + 8)
    if family_of_config(cfg).mlp == "sparse":
        return attention + sparse_mlp_bytes(cfg, n, compute_dtype, router_dtype)
    return attention + n * 4 * c * i


def sparse_mlp_bytes(cfg, tokens: int, compute_dtype: str, router_dtype: str = "activation") -> int:
    """Bytes an MoE block (align.model.moe, the loop backend every stage runs) saves: the fp32 routing probabilities
    (4 E), the top-k ids and the dispatch's inverse permutation (2 x 8 k), per token-slot the sorted input rows, the
    experts' gate_up, silu and product (c (D + 4 I)), the unsorted expert outputs and the top-k weights (c (D + 1));
    the router's input is the norm output the dense formula already counts, unless the router runs in fp32 on
    lower-precision activations: then its fp32 copy of the input replaces it and the fp32 weight copy is saved."""
    c, n, d, i = _bytes(compute_dtype), tokens, cfg.hidden_size, cfg.intermediate_size
    e, k = cfg.num_experts, cfg.num_experts_per_tok
    out = n * (4 * e + 16 * k + c * k * (2 * d + 4 * i + 1))
    if router_dtype == "fp32" and c < 4:
        out += n * (4 - c) * d + 4 * e * d
    return out


def router_stats_bytes(cfg, tokens: int) -> int:
    """Bytes the MoE objective's router statistics hold for backward, outside the (checkpointed) blocks: the training
    module asks for them on every forward under grad (align.train.moe_module, `RouterStats.from_logits`); per layer
    the fp32 logits and probabilities (8 E) and the log-sum-exp (4), once the token mask in fp32 (4). The entropy's
    log-probabilities and the top-k ids it saves on the way are freed within the forward (detached). 0 for a dense
    family."""
    if family_of_config(cfg).mlp != "sparse":
        return 0
    return tokens * (cfg.num_hidden_layers * (8 * cfg.num_experts + 4) + 4)


def saved_activation_bytes(cfg: MistralConfig, tokens: int, compute_dtype: str, checkpointing: bool,
                           label_tokens: int | None = None, row_len: int | None = None,
                           router_dtype: str = "activation") -> int:
    """Bytes saved for backward at the end of the forward: the trunk, input ids, RoPE tables and the fused head.
    Worst cases by default: every token labelled, one row (the RoPE tables are per position of a row)."""
    c, n, d, v = _bytes(compute_dtype), tokens, cfg.hidden_size, cfg.vocab_size
    labels = n if label_tokens is None else label_tokens
    per_block = c * n * d if checkpointing else block_activation_bytes(cfg, n, compute_dtype, router_dtype)
    once = 8 * n + 2 * c * (n if row_len is None else row_len) * cfg.head_dim
    head = 4 * n * d + 4 * n + c * n * d + labels * (8 + c * d) + 4 * v * d
    return cfg.num_hidden_layers * per_block + router_stats_bytes(cfg, n) + once + head


def head_transient_bytes(cfg: MistralConfig, chunk: int, compute_dtype: str) -> int:
    c, v, d = _bytes(compute_dtype), cfg.vocab_size, cfg.hidden_size
    return 4 * chunk * v + c * chunk * v + (c + 4) * v * d


def kv_cache_bytes(cfg: MistralConfig, engine: EngineConfig, dtype: str) -> int:
    per_block = 2 * cfg.num_hidden_layers * engine.block_size * cfg.num_key_value_heads * cfg.head_dim * _bytes(dtype)
    if engine.num_blocks is not None:
        return engine.num_blocks * per_block
    max_len = engine.max_model_len or cfg.max_position_embeddings
    wanted = engine.max_num_seqs * -(-max_len // engine.block_size)
    return max(1, min(wanted, engine.kv_cache_max_mb * 2 ** 20 // per_block)) * per_block


def plan(w: Workload, gpus: int, *, separate_host: bool = True) -> Plan:
    """Per-rank bytes of `w` on `gpus` ranks (FSDP2 when gpus > 1, as strategy "auto" / "fsdp" resolves)."""
    cfg = w.model
    shapes = param_shapes(cfg)
    block = block_numel(cfg)
    fsdp = w.sharded(gpus)
    shards = [shard_numel(s, gpus if fsdp else 1) for s in shapes]
    cdt = w.compute_dtype(gpus)
    b, c = _bytes(w.param_dtype), _bytes(cdt)
    out = Plan(w, gpus, cdt)
    local = sum(shards)
    out.terms["weights"] = b * local
    out.terms["gradients"] = b * local
    if fsdp and not w.parallel.sync_every_micro_batch and w.grad_accum > 1 and gpus > 1:
        out.terms["unsharded_gradients"] = c * sum(math.prod(s) for s in shapes)
    r = w.router_dtype
    out.terms["activations_ac"] = (saved_activation_bytes(cfg, w.tokens, cdt, True, router_dtype=r)
                                   + block_activation_bytes(cfg, w.tokens, cdt, r))
    out.terms["activations_no_ac"] = saved_activation_bytes(cfg, w.tokens, cdt, False, router_dtype=r)
    out.terms["head_transient"] = head_transient_bytes(cfg, min(w.head_chunk, w.tokens), cdt)
    if fsdp:
        root = sum(math.prod(s) for s in shapes) - cfg.num_hidden_layers * block
        reduce = _bytes(w.parallel.reduce_dtype)
        out.terms["fsdp_buffers"] = 2 * c * block + c * root + reduce * block
    if w.engine is not None:
        out.terms["engine_weights"] = _bytes(w.engine_dtype) * sum(math.prod(s) for s in shapes)
        out.terms["engine_kv_cache"] = kv_cache_bytes(cfg, w.engine, w.engine_dtype)
    for name in OPTIMIZERS:
        dev, host = optimizer_bytes(name, shards, w.param_dtype, min_8bit_numel=w.min_8bit_numel,
                                    separate_host=separate_host)
        out.optimizer_device[name], out.optimizer_host[name] = dev, host
    return out


# ------------------------------------------------------------------------------------------------ profile configs
def plan_architecture(plan_file: Path) -> MistralConfig:
    """plan.toml's `[model]`: the base checkpoint's config.json values, read by the config.json reader of the family
    its `model_type` names (absent: "mistral", as in a config.json): that family's defaults for omitted keys, its
    refusals by field name. A problem is one ConfigError naming the file and the key."""
    data = read_toml(plan_file)
    extra = sorted(set(data) - {"model"})
    if extra or not isinstance(data.get("model"), dict):
        raise ConfigError(f"{plan_file}: holds one table, [model] (the base checkpoint's config.json values); "
                          + (f"unknown key(s) {extra}" if extra else "[model] is missing"))
    source = f"{plan_file} [model]"
    try:
        return config_from_hf_dict(data["model"], source, family_of_config_dict(data["model"], source).spec)
    except CheckpointError as exc:
        raise ConfigError(str(exc)) from exc


def _architecture(profile_dir: Path, sft: SftStageConfig) -> MistralConfig:
    if sft.model.base and (Path(sft.model.base) / "config.json").exists():
        return load_hf_config(sft.model.base)
    plan_file = profile_dir / "plan.toml"
    if plan_file.exists():
        return plan_architecture(plan_file)
    if sft.model.base:
        raise ConfigError(f"{profile_dir / 'sft.toml'}: [model] base {sft.model.base!r} is not on this host and "
                          f"{plan_file} does not give its architecture")
    if sft.model.moe is not None:  # a from-scratch OLMoE, as align.model.family.from_scratch builds it
        return olmoe_config(sft.model.init, sft.model.moe)
    return scratch_config(sft.model.init, sft.model.family)


def _no_expert_parallel(path: Path, parallel: ParallelConfig) -> None:
    if parallel.expert_parallel > 1:  # expert shards stay out of FSDP2 and move rows by all-to-all: another plan
        raise ConfigError(f"{path}: [parallel] expert_parallel = {parallel.expert_parallel}; align.plan models "
                          f"FSDP2 / DDP / one process, not expert parallelism")


def _micro_tokens(loader, max_len: int) -> int:
    if loader.packing != "none":
        return loader.micro_batch_size * loader.seq_len
    return loader.max_tokens if loader.max_tokens is not None else loader.micro_batch_size * max_len


def workloads(profile: str, root: Path = ROOT) -> list[Workload]:
    """The profile's SFT workload, and its GRPO one (trainer + sampler on the same GPUs) when it has grpo.toml."""
    pdir = root / "configs" / profile
    if not (pdir / "sft.toml").exists():
        raise ConfigError(f"{pdir / 'sft.toml'}: no such file (profile {profile!r} has no SFT stage to plan)")
    sft = load_config(pdir / "sft.toml", SftStageConfig)
    _no_expert_parallel(pdir / "sft.toml", sft.parallel)
    arch = _architecture(pdir, sft)
    router = sft.model.moe.router_dtype if sft.model.moe is not None else "activation"
    out = [Workload("sft", arch, sft.model.dtype, sft.parallel, _micro_tokens(sft.loader, arch.max_position_embeddings),
                    sft.loader.grad_accum, sft.loss.chunk_size, sft.optimizer.min_8bit_numel, router_dtype=router)]
    if (pdir / "grpo.toml").exists():
        grpo = load_config(pdir / "grpo.toml", GrpoStageConfig)
        _no_expert_parallel(pdir / "grpo.toml", grpo.parallel)
        eng = grpo.rollout.engine
        max_len = eng.max_model_len or arch.max_position_embeddings
        out.append(Workload("grpo", arch, grpo.data.model_dtype, grpo.parallel,
                            grpo.shape.micro_batch_size * max_len, 1, grpo.loss.chunk_size,
                            grpo.optimizer.min_8bit_numel, eng, grpo.data.engine_dtype))
    return out


def configured_optimizer(profile: str, root: Path = ROOT) -> str:
    return str(read_toml(root / "configs" / profile / "sft.toml").get("optimizer", {}).get("name", "adamw"))


# ------------------------------------------------------------------------------------------------ report
def _gib(n: int) -> str:
    return f"{n / GIB:8.2f}"


def table(plans: list[Plan], usable: int) -> str:
    lines = []
    for p in plans:
        w = p.workload
        lines.append(f"[{w.stage}] {p.gpus} rank(s), {w.tokens} tokens per micro-batch, params {w.param_dtype}, "
                     f"compute {p.compute_dtype}, activation checkpointing "
                     f"{'on' if w.parallel.activation_checkpointing else 'off'}   (GiB per rank)")
        for k, v in p.terms.items():
            lines.append(f"  {k:<22}{_gib(v)}")
        lines.append("  " + " " * 22 + "".join(f"{n:>15}" for n in OPTIMIZERS))
        lines.append(f"  {'optimizer (device)':<22}" + "".join(f"{_gib(p.optimizer_device[n]):>15}" for n in OPTIMIZERS))
        lines.append(f"  {'optimizer (host)':<22}" + "".join(f"{_gib(p.optimizer_host[n]):>15}" for n in OPTIMIZERS))
        lines.append(f"  {'device total':<22}" + "".join(f"{_gib(p.device_total(n)):>15}" for n in OPTIMIZERS))
        lines.append(f"  {'fits ' + _gib(usable).strip() + ' GiB':<22}"
                     + "".join(f"{'yes' if p.device_total(n) <= usable else 'NO':>15}" for n in OPTIMIZERS))
    return "\n".join(lines)


def verdict(plans: list[Plan], optimizer: str, usable: int, host_mem: int | None, profile: str, gpu_mem: float) -> str | None:
    """Why the plan does not fit with `optimizer`, or None."""
    for p in plans:
        need = p.device_total(optimizer)
        if need > usable:
            return (f"{profile} on {p.gpus} x {gpu_mem:g} GiB with {optimizer}: {p.workload.stage} needs "
                    f"{need / GIB:.1f} GiB per GPU, {usable / GIB:.1f} GiB usable")
        host = p.optimizer_host[optimizer] * p.gpus
        if host_mem is not None and host > host_mem:
            return (f"{profile} on {p.gpus} GPUs with {optimizer}: {p.workload.stage} needs {host / GIB:.1f} GiB of "
                    f"host memory for the optimizer, {host_mem / GIB:.1f} GiB given")
    return None


def sweep(profile: str, gpus: list[int], mems: list[float], headroom: float) -> str:
    """A markdown table: per GPU count, each optimizer's device GiB per rank for every stage, offload_adamw's host
    GiB per rank, and for each GPU size the optimizers each stage fits with."""
    loads = workloads(profile)
    stages = "/".join(w.stage for w in loads)
    head = (["GPUs"] + [f"{n} device GiB ({stages})" for n in OPTIMIZERS] + ["offload_adamw host GiB"]
            + [f"fits {m:g} GiB" for m in mems])
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for g in gpus:
        plans = [plan(w, g) for w in loads]
        cells = [str(g)] + ["/".join(f"{p.device_total(n) / GIB:.1f}" for p in plans) for n in OPTIMIZERS]
        cells.append(f"{max(p.optimizer_host['offload_adamw'] for p in plans) / GIB:.1f}")
        for m in mems:
            usable = int(m * GIB * (1 - headroom))
            cells.append("; ".join(f"{p.workload.stage}: " + (", ".join(
                n for n in OPTIMIZERS if p.device_total(n) <= usable) or "none") for p in plans))
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m align.plan", description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", required=True)
    ap.add_argument("--gpus", type=int, help="ranks (GPUs) the stages are sharded over")
    ap.add_argument("--gpu-mem", type=float, help="memory per GPU in GiB")
    ap.add_argument("--sweep", action="store_true", help="a markdown table over 1, 2, 4, 8 GPUs of 24, 80, 141 GiB")
    ap.add_argument("--optimizer", choices=OPTIMIZERS, help="the one the verdict is for (default: sft.toml's)")
    ap.add_argument("--host-mem", type=float, help="host memory of the node in GiB (checks offload_adamw's state)")
    ap.add_argument("--headroom", type=float, default=0.10, help="share of GPU memory kept free (default 0.10)")
    ap.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    args = ap.parse_args(argv)
    if args.sweep:
        print(sweep(args.profile, [1, 2, 4, 8], [24.0, 80.0, 141.0], args.headroom))
        return 0
    if args.gpus is None or args.gpu_mem is None:
        raise ConfigError("align.plan: --gpus and --gpu-mem are required (or --sweep)")
    if args.gpus < 1 or args.gpu_mem <= 0 or not 0 <= args.headroom < 1:
        raise ConfigError(f"align.plan: --gpus >= 1, --gpu-mem > 0 and 0 <= --headroom < 1 (got {args.gpus}, "
                          f"{args.gpu_mem}, {args.headroom})")
    plans = [plan(w, args.gpus) for w in workloads(args.profile)]
    optimizer = args.optimizer or configured_optimizer(args.profile)
    usable = int(args.gpu_mem * GIB * (1 - args.headroom))
    host_mem = int(args.host_mem * GIB) if args.host_mem is not None else None
    if args.json:
        print(json.dumps({"profile": args.profile, "gpus": args.gpus, "gpu_mem_gib": args.gpu_mem,
                          "usable_bytes": usable, "optimizer": optimizer, "stages": [
                              {"stage": p.workload.stage, "terms": p.terms, "optimizer_device": p.optimizer_device,
                               "optimizer_host": p.optimizer_host,
                               "device_total": {n: p.device_total(n) for n in OPTIMIZERS}} for p in plans]},
                         sort_keys=True))
    else:
        print(table(plans, usable))
    why = verdict(plans, optimizer, usable, host_mem, args.profile, args.gpu_mem)
    if why is not None:
        raise PreflightRefused(f"plan does not fit: {why}")
    if not args.json:
        print(f"plan fits: {args.profile} on {args.gpus} x {args.gpu_mem:g} GiB with {optimizer}")
    return 0


if __name__ == "__main__":
    sys.exit(run_with_exit_codes(main))
