"""`Trainer`: the loop. Batch iteration, the accumulation window, checkpoint cadence and retention, resume, metrics
history, and the terminal conditions (step budget, data exhausted, signal, wall budget, skip cap, tripwire). It
never sees a loss formula: the TrainModule (align.train.train_module) owns forward, loss, backward and the step.

One optimizer-step boundary, on every rank, in this order (each collective is reached by every rank):
    1. next window from the loader (a StepBatch's `micro_batches`, or a list of batch dicts)
    2. SUM-reduce [this window's loss units, data exhausted]   -> the normalisation denominator; stop together
    3. module.train_batch(micro, AccumInfo) per micro-batch    (gradient sync on the last one only)
    4. module.optim_step() -> StepOutcome; module.zero_grads()     (skip decided from an all-reduced norm)
    5. SUM-reduce the window's statistics                     -> the logged metrics (global)
    6. callbacks observe (speed, tripwires: rank-local halt reasons)
    7. MAX-reduce [signalled, wall_spent, nonfinite, skipped, tripwire]   (align.train.control.agree)
    8. history row (rank 0); tripwire -> HALT 80; skip cap -> HALT 81; checkpoint if due or stopping;
       signal -> exit 128 + signum; wall budget -> HALT.json + exit 82
A stop is only ever taken here, so it never lands mid-accumulation or mid-save.

Resume: the newest complete checkpoint under `<run_dir>/checkpoints/` of the same run (the `identity` a stage passes,
align.train.identity: config and input digests; checkpoints of another run are moved aside and training starts
afresh) restores weights, the TrainModule's state
(optimizer, schedule step), its extra state, the loader position, every rank's RNG streams, the step counters, the
skip statistics, callbacks' state and pins. An uninterrupted run and one interrupted and resumed at any boundary
end with bitwise-equal weights (same world size). A run interrupted mid-window resumes from the last checkpoint.

Contract for stages: `Trainer(config, module, loader, run_dir, callbacks).fit() -> exit code` (0, 82, 128+N);
halts raise HaltError (80, 81) on every rank after rank 0 wrote HALT.json. `publish_final(dir, ...)` writes the
HF-format `final/` checkpoint after a successful fit."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from align.exceptions import ConfigError
from align.exit_codes import NONFINITE_HALT, TRIPWIRE_HALT, WALL_BUDGET, write_halt_marker
from align.train import checkpoint as ckpt_io
from align.train import faults
from align.train import sharded_checkpoint as sharded_io
from align.train.callbacks import Callback
from align.train.ckpt_format import WeightFormat, weight_format_for
from align.train.control import Flags, SkipTracker, StopSignals, agree, agreed_reason, halt_together
from align.train.identity import identity_difference
from align.train.rng import capture_rng_state, restore_rng_state
from align.train.train_module import AccumInfo, StepOutcome, TrainModule, resolve_replicated
from align.utils.dist import all_reduce_sum, broadcast_object, gather_object, is_rank0, pg_timeout_s, rank, \
    set_pg_timeout, world_size
from align.utils.heap import frozen_heap
from align.utils.tracking import MetricsHistory


@dataclass(frozen=True)
class TrainerConfig:
    """[train] table: the loop's budget, cadence and control-plane limits."""

    max_steps: int  # optimizer-step boundaries (windows) to run; skipped steps count
    checkpoint_every: int = 0  # save every N steps (0: only at the end and on a stop)
    keep_last: int = 2  # complete checkpoints kept (newest first), besides pinned ones
    pin_every: int = 0  # checkpoints at multiples of N steps are never pruned (0: none)
    max_wall_seconds: float | None = None  # this attempt's wall budget: checkpoint, HALT.json, exit 82
    max_consecutive_skipped_steps: int = 3  # more consecutive bad steps: HALT 81
    max_skipped_fraction: float = 0.05  # more bad steps than this fraction (after skipped_fraction_after): HALT 81
    skipped_fraction_after: int = 100
    pg_timeout_after_first_step_s: float | None = 600.0  # shorter collective timeout once start-up is behind
    checkpoint_format: str = "hf"  # "sharded": per-rank DCP shards, no rank-0 gather (align.train.sharded_checkpoint)

    def __post_init__(self):
        if self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {self.max_steps}")
        if self.keep_last < 1:
            raise ValueError(f"keep_last must be >= 1, got {self.keep_last}")
        if self.checkpoint_every < 0 or self.pin_every < 0:
            raise ValueError("checkpoint_every and pin_every must be >= 0")
        if self.checkpoint_format not in sharded_io.FORMATS:
            raise ValueError(f"checkpoint_format must be one of {sharded_io.FORMATS}, got {self.checkpoint_format!r}")


def _window(item) -> list[dict]:
    if isinstance(item, dict):
        return [item]
    return list(getattr(item, "micro_batches", item))


class Trainer:
    def __init__(self, config: TrainerConfig, module: TrainModule, loader, run_dir: str | os.PathLike,
                 callbacks: list[Callback] = (), identity: dict | None = None,
                 weight_format: WeightFormat | None = None):
        self.cfg, self.module, self.loader = config, module, loader
        self._weight_format = weight_format  # None: the format of the module's model family
        self.identity = identity  # None: any checkpoint under run_dir is this run's (tests, ad-hoc loops)
        self.run_dir = Path(run_dir)
        self.ckpt_root = self.run_dir / "checkpoints"
        self.callbacks = list(callbacks)
        self.step = 0  # boundaries completed
        self.micro_step = 0
        self.pinned: set[int] = set()
        self.resumed_from: Path | None = None
        self.checkpoints_written: list[Path] = []
        self.skips = SkipTracker(config.max_consecutive_skipped_steps, config.max_skipped_fraction,
                                 config.skipped_fraction_after)
        self.history = MetricsHistory(self.run_dir / "history.jsonl", enabled=is_rank0())
        self._last_saved_step: int | None = None

    # ------------------------------------------------------------------------------------------------ the loop
    def fit(self) -> int:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if self.cfg.checkpoint_format == sharded_io.LAYOUT:
            if self._weight_format is not None:  # e.g. LoRA's adapters-only steps: the sharded layout has no seam
                raise ConfigError("checkpoint_format = 'sharded' writes the model's own weights; this run's custom "
                                  f"weight format ({type(self._weight_format).__name__}) needs 'hf'")
            sharded_io.require_supported(self.module.model, self.module.optimizer)
        self.resume()
        ckpt_io.check_disk(self.ckpt_root, self.module.model, self.cfg.keep_last)  # refuse now, not at a save
        self.history.truncate_after(self.step)  # a resume replays the steps after its checkpoint
        for cb in self.callbacks:
            cb.on_fit_start(self)
        code = None
        try:
            with StopSignals() as signals, frozen_heap():
                code = self._loop(signals, time.monotonic())
        finally:
            for cb in self.callbacks:
                cb.on_fit_end(self, code if code is not None else -1)
        return code

    def _loop(self, signals: StopSignals, start: float) -> int:
        it = iter(self.loader)
        first = True
        while self.step < self.cfg.max_steps:
            window, units, exhausted = self._next_window(it)
            if exhausted:
                break
            local = self._run_window(window, units)
            metrics = self._window_metrics(local)
            reasons = [r for cb in self.callbacks if (r := cb.observe(self, metrics)) is not None]
            wall = self.cfg.max_wall_seconds is not None and time.monotonic() - start > self.cfg.max_wall_seconds
            skipped = local["outcome"] is StepOutcome.SKIPPED
            flags = agree(Flags(signals.signum, wall, local["nonfinite"], skipped, bool(reasons)))
            self.skips.record(flags)
            metrics["skipped_total"] = float(self.skips.bad)
            self.history.log(self.step, metrics)
            for cb in self.callbacks:
                cb.on_step_end(self, metrics)
            if first and self.cfg.pg_timeout_after_first_step_s is not None:  # start-up collectives are behind
                set_pg_timeout(min(pg_timeout_s(), self.cfg.pg_timeout_after_first_step_s))
            first = False
            code = self._decide(flags, reasons)
            if code is not None:
                return code
        self.save_checkpoint()
        return 0

    def _next_window(self, it) -> tuple[list[dict], float, bool]:
        """This rank's micro-batches and the window's global loss units; stop together if any rank ran dry."""
        try:
            window = _window(next(it))
        except StopIteration:
            window = []
        units = sum(self.module.loss_units(b) for b in window)
        total, dry = all_reduce_sum([units, 0.0 if window else 1.0]).tolist()
        return window, total, dry > 0

    def _run_window(self, window: list[dict], units: float) -> dict:
        sums: dict[str, torch.Tensor] = {}
        nonfinite = torch.zeros((), dtype=torch.bool)
        for i, batch in enumerate(window):
            faults.at_micro(self.step + 1, i, self.module.model)  # no-op unless ALIGN_FAULTS arms it
            out = self.module.train_batch(batch, AccumInfo(i, len(window), units, world_size()))
            for k, v in out.sums.items():
                sums[k] = sums[k] + v if k in sums else v
            nonfinite = nonfinite | out.nonfinite.cpu()
        outcome = self.module.optim_step()
        self.module.zero_grads()
        self.step += 1
        self.micro_step += len(window)
        return {"sums": sums, "nonfinite": bool(nonfinite), "outcome": outcome}

    def _window_metrics(self, local: dict) -> dict:
        """Global window statistics (SUM over ranks) turned into logged numbers by the module."""
        keys = sorted(local["sums"])
        values = torch.stack([local["sums"][k].detach().float().cpu() for k in keys]) if keys else torch.zeros(0)
        totals = all_reduce_sum(values).tolist()
        metrics = self.module.log_metrics(dict(zip(keys, totals)))
        metrics.update({k: float(v) for k, v in self.module.last.items()})
        metrics["applied"] = float(local["outcome"] is StepOutcome.APPLIED)
        metrics["step"] = self.step
        return metrics

    def _decide(self, flags: Flags, reasons: list[str]) -> int | None:
        """The agreed action at this boundary (None: carry on)."""
        if flags.tripwire:
            halt_together(self.run_dir, TRIPWIRE_HALT, f"tripwire at step {self.step}: " + agreed_reason(
                "; ".join(reasons) or None))
        verdict = self.skips.verdict()
        if verdict is not None:
            halt_together(self.run_dir, NONFINITE_HALT, f"skip cap at step {self.step}: {verdict}")
        stopping = flags.signalled or flags.wall_spent
        due = self.cfg.checkpoint_every and self.step % self.cfg.checkpoint_every == 0
        if stopping or due or self.step == self.cfg.max_steps:
            self.save_checkpoint()
        if flags.signalled:
            return 128 + flags.signalled
        if flags.wall_spent:
            if is_rank0():
                write_halt_marker(self.run_dir, WALL_BUDGET,
                                  f"train.max_wall_seconds = {self.cfg.max_wall_seconds} spent at step {self.step}")
            return WALL_BUDGET
        return None

    # ------------------------------------------------------------------------------------------------ state
    def pin_checkpoint(self, step: int) -> None:
        """Keep the checkpoint of `step` through pruning (persisted in resume.pt)."""
        self.pinned.add(int(step))

    def _rank_state(self) -> dict:
        return {"rng": capture_rng_state(), "loader": self.loader.state_dict(),
                "extra": self.module.extra_state(),
                "callbacks": {cb.name: cb.state_dict() for cb in self.callbacks}}

    def save_checkpoint(self) -> Path | None:
        """Collective. Writes `checkpoints/step_<step>` unless this step is already saved."""
        if self._last_saved_step == self.step:
            return None
        sharded = self.cfg.checkpoint_format == sharded_io.LAYOUT
        weights = {} if sharded else self.module.full_model_state_dict()
        ranks = gather_object(self._rank_state())  # rank 0 writes resume.pt; the others' states go to it only
        if self.cfg.pin_every and self.step % self.cfg.pin_every == 0:
            self.pinned.add(self.step)
        resume = {"micro_step": self.micro_step, "ranks": ranks, "skips": self.skips.state_dict(),
                  "pinned": sorted(self.pinned)}
        if sharded:
            path = sharded_io.save_sharded(self.ckpt_root, self.step, model=self.module.model,
                                           optimizer=self.module.optimizer, identity=self.identity,
                                           resume=dict(resume, module_step=self.module.step),
                                           hf_config=self._hf_config())
        else:
            path = ckpt_io.save_checkpoint(self.ckpt_root, self.step, weights=weights,
                                           write_weights=self._write_weights, resume=resume,
                                           module_state=self.module.state_dict(), identity=self.identity)
        self._last_saved_step = self.step
        self.checkpoints_written.append(path)
        ckpt_io.prune(self.ckpt_root, self.cfg.keep_last, self.pinned)
        for cb in self.callbacks:
            cb.on_checkpoint_saved(self, path)
        return path

    @property
    def weight_format(self) -> WeightFormat:
        """How weight files are written and read (align.train.ckpt_format): the model family's format."""
        if self._weight_format is None:
            self._weight_format = weight_format_for(self.module.model)
        return self._weight_format

    def _hf_config(self) -> dict:
        """What align.model.config_io.save_hf_config needs to write this model's config.json."""
        m = self.module.model
        dtype = next(p.dtype for p in m.parameters() if p.is_floating_point())
        return {"cfg": m.config, "architecture": m.hf_architecture, "extra": m.hf_config_extra(),
                "dtype": str(dtype).removeprefix("torch.")}

    def _write_weights(self, weights: dict, out_dir: Path, **kwargs) -> Path:
        return self.weight_format.write(self.module.model, weights, out_dir, **kwargs)

    def resume(self) -> Path | None:
        """Restore everything from the newest complete checkpoint, if any (rank 0 chooses for all)."""
        found = self._own_latest_checkpoint() if is_rank0() else None
        found = broadcast_object(str(found) if found else None)
        if found is None:
            return None
        ckpt = Path(found)
        if ckpt_io.checkpoint_layout(ckpt) == sharded_io.LAYOUT:  # each rank reads its part; any world size
            payload = sharded_io.load_sharded(ckpt, self.module.model, self.module.optimizer)
            self.module.step = int(payload["module_step"])
            who, _exact = sharded_io.rank_state(payload)
        else:
            payload = ckpt_io.load_resume(ckpt)
            self.module.load_model_state_dict(self.weight_format.read(self.module.model, ckpt / ckpt_io.MODEL_DIR))
            self.module.load_state_dict(payload["module"])
            who = rank()
        mine = payload["ranks"][who]
        self.module.load_extra_state(resolve_replicated([r["extra"] for r in payload["ranks"]], who))
        self.loader.load_state_dict(mine["loader"])
        for cb in self.callbacks:
            cb.load_state_dict(mine["callbacks"].get(cb.name, {}))
        restore_rng_state(mine["rng"])
        self.step, self.micro_step = int(payload["step"]), int(payload["micro_step"])
        self.skips.load_state_dict(payload["skips"])
        self.pinned = set(payload["pinned"])
        self._last_saved_step = self.step
        self.resumed_from = ckpt
        self.checkpoints_written.append(ckpt)
        return ckpt

    def _own_latest_checkpoint(self) -> Path | None:
        """Rank 0: the newest complete checkpoint if it belongs to this run; else set them all aside (None)."""
        found = ckpt_io.latest_checkpoint(self.ckpt_root)
        if found is None or self.identity is None:
            return found
        why = identity_difference(ckpt_io.checkpoint_identity(found), self.identity)
        if why is None:
            return found
        aside = ckpt_io.supersede(self.ckpt_root)
        print(f"trainer: not resuming {found} ({why}); training afresh, old checkpoints moved to {aside}",
              flush=True)
        return None

    def publish_final(self, out_dir: str | os.PathLike, **kwargs) -> Path | None:
        """Collective: the trained weights as an HF checkpoint at `out_dir` (staged, manifest last); rank 0 writes.
        kwargs go to align.model.checkpoint.save_state_dict (tokenizer_dir, inputs, dtype, max_shard_bytes)."""
        weights = self.module.full_model_state_dict()
        path = None
        if is_rank0():
            path = self._write_weights(weights, Path(out_dir), **kwargs)
            self._check_roundtrip(path, weights)
        return Path(broadcast_object(str(path) if path else None))

    def _check_roundtrip(self, path: Path, weights: dict) -> None:
        """Rank 0: the published checkpoint loads back into exactly these weights and this forward, or the stage
        fails before anything downstream (or a receipt) can use it (align.model.roundtrip)."""
        from align.model.roundtrip import check_published

        model = self.module.model
        # NOTE: a sharded model cannot run a forward on one rank, and a GPU forward is not bitwise a CPU one: then
        # the probe runs on a CPU model built from the gathered weights.
        on_cpu = next(model.parameters()).device.type == "cpu"
        report = check_published(model, path, weights=None if world_size() == 1 and on_cpu else weights)
        print(f"trainer: published {path}: round trip exact ({report['tensors']} tensors, forward equal)",
              flush=True)


