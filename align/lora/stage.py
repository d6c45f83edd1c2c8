"""`[lora]` in a training stage (SFT, DPO, GRPO, PPO): what a stage calls so that LoRA changes no stage's default path.

A stage config holds `lora: LoraConfig | None = None`; with the table present the stage
1. `maybe_lora(model, cfg.lora)` right after building the policy and before its TrainModule, so the optimizer is
   built over the adapters only (align.train.optim takes parameters with requires_grad);
2. `Trainer(..., weight_format=lora_weight_format(cfg.lora, module.model, base, run_dir))`
   (align.lora.checkpoint): a step checkpoint's `model/` holds the adapters and names the frozen base by path
   and content hash (the base is never copied per step; a from-scratch base is written once per run), resume reads
   the base back from it after checking the hash;
3. `publish_final(trainer, cfg.lora, final, ...)`: `final/` is the MERGED ordinary HF checkpoint (W + B A alpha/r,
   align.lora.adapters.merge_state_dict), its round trip checked bitwise against the merged weights as the Trainer checks
   its own, plus, with `save_adapter = true`, the adapter alone in peft's layout under `final/adapter/` (written
   before the manifest, so the manifest lists it and `final/` appears whole or not at all);
4. samplers of the policy (GRPO's and PPO's rollout engine, the SFT/DPO in-loop Engine), `[lora] engine_sync`:
   - "adapters" (the default), `AdapterWeightsClient`: the engine holds a LoRA-wrapped copy of the frozen base, whose
     panels it packs once, and runs base(x) + (x A^T)(s B)^T in its decode step (align.lora.decode); a sync
     sends only the adapter tensors (Engine.load_adapters), the base is checked equal to the policy's once, at the
     first push. Cost per sync: the adapters' bytes and their few-kB repack (bench/lora_push.py); per decode step,
     two thin products per fused projection (r columns).
   - "merged", `MergedWeightsClient`: the engine holds a plain model and every sync merges W + B A alpha/r for every
     wrapped weight (one (out x r) @ (r x in) product and one new tensor each) and copies and repacks all of them:
     1.19x a plain push's CPU time on the tiny policy (docs/MEASUREMENTS.md "## ppo"), with a decode step exactly a
     plain model's."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn

from align.eval.inloop import build_inloop_eval, engine_copy, full_weights
from align.lora.adapters import (ADAPTER_KEYS, LoraConfig, apply_lora, lora_layers, merge, merge_state_dict,
                            peft_adapter_state, save_adapter_state, trainable_parameters)
from align.rollout.native import NativeRolloutClient
from align.utils.dist import broadcast_object, is_rank0
from align.utils.fsio import publish_dir, staging_dir
from align.utils.manifest import RESERVED_KEYS, read_manifest, write_manifest



def maybe_lora(model: nn.Module, cfg: LoraConfig | None, label: str = "", seed: int | None = None) -> nn.Module:
    """`model` with LoRA applied in place when `cfg` is given (else unchanged); prints the trainable share.

    `seed` (the stage's [run] seed): the adapters' A init is drawn from it, without touching the global RNG.
    NOTE: drawn from the global RNG instead, A depended on whatever the process had drawn before (the same stage
    run in a fresh process and inside a test process started from different adapters)."""
    if cfg is None:
        return model
    if seed is None:
        apply_lora(model, cfg)
    else:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            apply_lora(model, cfg)
    if is_rank0():
        total = sum(p.numel() for p in model.parameters())
        train = sum(p.numel() for _, p in trainable_parameters(model))
        print(f"{label or 'lora'}: LoRA r={cfg.rank} alpha={cfg.alpha} on {list(cfg.target_modules)}: "
              f"{train / 1e3:.1f}k of {total / 1e6:.2f}M parameters train ({train / total:.2%})", flush=True)
    return model


class MergedWeightsClient:
    """A rollout client over a PLAIN copy of the policy, fed by a LoRA policy: `update_weights` merges the adapters
    (merge_state_dict) before the inner client loads the weights; everything else is the inner client's."""

    def __init__(self, client, cfg: LoraConfig):
        self.client, self.scaling = client, cfg.scaling

    def update_weights(self, state_dict, version: int | None = None) -> int:
        return self.client.update_weights(merge_state_dict(dict(state_dict), self.scaling), version)

    def __getattr__(self, name: str):
        return getattr(self.client, name)


class AdapterWeightsClient:
    """A rollout client over a LoRA-wrapped copy of the policy's frozen base (wrapped here when the inner client's
    engine model has no adapters yet), fed by the LoRA policy: `update_weights` sends the adapter tensors only; the
    first push also checks that the base it carries equals the engine's (a sampler on another base would be a fourth
    distribution, silently trained on)."""

    def __init__(self, client, cfg: LoraConfig):
        engine = getattr(client, "engine", None)
        if engine is None or not hasattr(client, "update_adapters"):
            raise ValueError(f"[lora] engine_sync = 'adapters' needs the native rollout backend (its Engine runs the "
                             f"adapters); {type(client).__name__} has none: set engine_sync = 'merged'")
        if not lora_layers(engine.model):
            # NOTE: the sampler's adapter init is overwritten by the first push; it must not draw from the global
            # RNG, or wrapping the sampler would change the policy's own adapter init (maybe_lora runs after it)
            with torch.random.fork_rng(devices=[]):
                apply_lora(engine.model, cfg)
            engine.model.requires_grad_(False)
        self.client, self.base_checked = client, False

    def update_weights(self, state_dict, version: int | None = None) -> int:
        if not self.base_checked:
            self._check_base(state_dict)
        adapters = {k: v for k, v in state_dict.items() if k.endswith(ADAPTER_KEYS)}
        return self.client.update_adapters(adapters, version)

    def _check_base(self, state_dict) -> None:
        params = dict(self.client.engine.model.named_parameters(remove_duplicate=False))
        for name, tensor in state_dict.items():
            if not name.endswith(ADAPTER_KEYS) and name in params:
                mine = params[name]
                if not torch.equal(mine, tensor.to(device=mine.device, dtype=mine.dtype)):
                    raise ValueError(f"AdapterWeightsClient: the policy's frozen {name} differs from the sampler's "
                                     f"base: the engine was built from another checkpoint than the policy's start")
        self.base_checked = True

    def __getattr__(self, name: str):
        return getattr(self.client, name)


def lora_client(client, lora: LoraConfig | None):
    """The rollout client a LoRA stage pushes to: `client` itself without LoRA, else per `lora.engine_sync`."""
    if lora is None:
        return client
    return AdapterWeightsClient(client, lora) if lora.engine_sync == "adapters" else MergedWeightsClient(client, lora)


def inloop_eval(cfg, runs: Path, tok, module, total_steps: int, lora: LoraConfig | None,
                engine_model: nn.Module | None):
    """align.eval.inloop.build_inloop_eval for SFT/DPO; with LoRA its Engine holds a copy of the LoRA model
    ("adapters") or a merged plain copy ("merged"), and every evaluation first pushes the training weights into it."""
    if lora is None or not cfg.every:
        return build_inloop_eval(cfg, runs, tok, module, total_steps, engine_model=engine_model)
    copy = engine_copy(module.model)
    client = lora_client(NativeRolloutClient(copy if lora.engine_sync == "adapters" else merge(copy),
                                             vocab_limit=tok.vocab_size), lora)
    callback = build_inloop_eval(cfg, runs, tok, module, total_steps, client=client)
    callback.sync = lambda: client.update_weights(full_weights(module.model))  # as build_inloop_eval's own copy
    return callback


def publish_final(trainer, lora: LoraConfig | None, out_dir: str | os.PathLike, *, base_model: str | None = None,
                  **kwargs) -> Path:
    """Collective: `trainer.publish_final` without LoRA; with it the merged HF checkpoint (+ final/adapter/ when
    `lora.save_adapter`). kwargs: align.model.checkpoint.save_state_dict's (tokenizer_dir, inputs, dtype)."""
    if lora is None:
        return trainer.publish_final(out_dir, **kwargs)
    weights = trainer.module.full_model_state_dict()  # collective: full CPU tensors on rank 0
    path = None
    if is_rank0():
        path = _publish_merged(trainer, lora, weights, Path(out_dir), base_model, kwargs)
    return Path(broadcast_object(str(path) if path else None))


def _publish_merged(trainer, lora: LoraConfig, weights: dict, final: Path, base_model: str | None,
                    kwargs: dict) -> Path:
    from align.model.roundtrip import check_published

    merged = merge_state_dict(weights, lora.scaling)
    tmp = staging_dir(final)  # final.partial-<pid>: cleaned by the next writer if this process dies
    tmp.rmdir()  # the weight format publishes its own staging dir here
    fmt = trainer.weight_format  # a LoRA run's steps use LoraWeightFormat; final/ is the family's own layout
    getattr(fmt, "inner", fmt).write(trainer.module.model, merged, tmp, **kwargs)
    if lora.save_adapter:
        save_adapter_state(peft_adapter_state(weights), lora, tmp / "adapter", base_model)
        manifest = read_manifest(tmp)
        write_manifest(tmp, manifest["kind"], inputs=manifest["inputs"],
                       extra={k: v for k, v in manifest.items() if k not in RESERVED_KEYS})
    publish_dir(tmp, final)
    report = check_published(trainer.module.model, final, weights=merged)  # a plain model built from `merged`
    print(f"lora: published the merged checkpoint {final}: round trip exact ({report['tensors']} tensors, forward "
          f"equal){'; adapter in final/adapter/' if lora.save_adapter else ''}", flush=True)
    return final
