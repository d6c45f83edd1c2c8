"""Worker for the 2-rank gloo tests (launched by torch.distributed.run from tests/train/test_distributed.py).

Modes (several per launch: a torchrun start costs seconds on two shared cores):
  equivalence   4-step runs under fsdp, ddp, fsdp + activation checkpointing, fsdp syncing every micro-batch, fsdp
                with bf16 compute; rank 0 saves final weights to <out>/<variant>.pt (histories in <out>/<variant>/)
  resume        per optimizer: an uninterrupted fsdp run, a run that crashes mid-window on every rank, and its
                resume in a fresh Trainer; rank 0 saves both final weight sets
  sigterm:NAME  one run in <out>/NAME; rank <victim> sends itself SIGTERM inside step <at_step>; the exit code and
                step go to <out>/NAME_exit_rank<r>.txt and the process exits with it (a later launch resumes)
  plain:NAME    one run to the end in <out>/NAME (resuming if it has checkpoints); rank 0 saves <out>/NAME.pt
  nan:NAME      rank 1's losses are NaN from step <at_step> on: both ranks must skip, then halt with 81
  wall:NAME     only rank 1 overruns max_wall_seconds in step <at_step>: both must stop there with 82
  tripwire:NAME rank 0 alone asks for a halt at step <at_step>: both must raise HaltError 80 with the same text
  dry:NAME      rank 1's data ends after <at_step> windows: both end the run there (exit 0, final checkpoint)
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
torch.set_num_threads(1)

from align.exceptions import HaltError  # noqa: E402
from align.train.callbacks import Callback  # noqa: E402
from align.utils.dist import barrier, exit_process, init_distributed, rank, world_size  # noqa: E402
from train_helpers import FiniteLoader, ListLoader, build_sft, sft_windows, weights  # noqa: E402

ACCUM = 2


def rank_loader(n_windows: int = 5) -> ListLoader:
    """This rank's share of global windows of world x ACCUM micro-batches (rank r takes a contiguous slice)."""
    glob = sft_windows(n_windows, world_size() * ACCUM)
    r = rank()
    return ListLoader([w[r * ACCUM:(r + 1) * ACCUM] for w in glob])


def trainer(run_dir, strategy="fsdp", **kw):
    return build_sft(run_dir, accum=ACCUM, strategy=strategy, loader=rank_loader(), **kw)


def save(obj, path):
    if rank() == 0:
        torch.save(obj, path)


VARIANTS = {  # name: (strategy, ParallelConfig overrides)
    "fsdp": ("fsdp", {}), "ddp": ("ddp", {}),
    "fsdp_ac": ("fsdp", {"activation_checkpointing": True}),
    "fsdp_sync": ("fsdp", {"sync_every_micro_batch": True}),
    "fsdp_bf16": ("fsdp", {"param_dtype": "bfloat16"}),
}


def mode_equivalence(out: Path):
    for name, (strategy, overrides) in VARIANTS.items():
        t = trainer(out / name, strategy, max_steps=4, checkpoint_every=0, parallel=overrides)
        wrapper = type(t.module.net).__name__
        assert wrapper == {"fsdp": "FSDPLossForward", "ddp": "DistributedDataParallel"}[strategy], wrapper
        assert t.fit() == 0
        save(weights(t.module), out / f"{name}.pt")


class Crash(Exception):
    pass


def mode_resume(out: Path):
    for opt in ("adamw", "adamw8bit"):
        full = trainer(out / f"{opt}_full", max_steps=5, checkpoint_every=2, optimizer=opt)
        assert full.fit() == 0
        w_full = weights(full.module)

        def fault(module, batch, info, count=[0]):
            count[0] += 1
            if count[0] == 2 * 3 + 2:  # step 4's second micro-batch: mid-window, after the step-2 checkpoint
                raise Crash()

        crashed = trainer(out / f"{opt}_cut", max_steps=5, checkpoint_every=2, optimizer=opt, fault=fault)
        try:
            crashed.fit()
            raise AssertionError("the fault did not fire")
        except Crash:
            pass
        resumed = trainer(out / f"{opt}_cut", max_steps=5, checkpoint_every=2, optimizer=opt)
        assert resumed.fit() == 0 and resumed.resumed_from.name == "step_2", resumed.resumed_from
        save({"full": w_full, "resumed": weights(resumed.module)}, out / f"resume_{opt}.pt")


def record(out: Path, name: str, code: int, step: int) -> None:
    (out / f"{name}_exit_rank{rank()}.txt").write_text(f"{code} {step}\n")


def mode_sigterm(out: Path, name: str, at_step: int, victim: int):
    def fault(module, batch, info, count=[0]):
        count[0] += 1
        if rank() == victim and count[0] == (at_step - 1) * ACCUM + 1:
            os.kill(os.getpid(), signal.SIGTERM)  # lands mid-window, on one rank only

    t = trainer(out / name, max_steps=8, checkpoint_every=3, fault=fault)
    code = t.fit()
    record(out, name, code, t.step)
    # NOTE: torchrun SIGTERMs the other workers once one exits non-zero; without this barrier a rank that exits
    # first (143) can get its peer killed before that peer has recorded its own outcome (seen once under load)
    barrier()
    exit_process(code)


def mode_plain(out: Path, name: str, **_):
    t = trainer(out / name, max_steps=8, checkpoint_every=3)
    assert t.fit() == 0
    save(weights(t.module), out / f"{name}.pt")


def _halting(out: Path, name: str, t) -> None:
    try:
        code = t.fit()
    except HaltError as exc:
        code = exc.exit_code
        (out / f"{name}_reason_rank{rank()}.txt").write_text(str(exc))
    record(out, name, code, t.step)


def mode_nan(out: Path, name: str, at_step: int, **_):
    def fault(module, batch, info, count=[0]):
        count[0] += 1
        if rank() == 1 and count[0] > (at_step - 1) * ACCUM:
            module.poison = True  # every later loss on rank 1 only is NaN

    _halting(out, name, trainer(out / name, max_steps=12, checkpoint_every=0, fault=fault))


def mode_wall(out: Path, name: str, at_step: int, **_):
    def fault(module, batch, info, count=[0]):
        count[0] += 1
        if rank() == 1 and count[0] == (at_step - 1) * ACCUM + 1:
            time.sleep(3.0)  # only rank 1's clock passes the budget

    _halting(out, name, trainer(out / name, max_steps=12, checkpoint_every=0, fault=fault, max_wall_seconds=2.5))


class OneRankTripwire(Callback):
    """Asks for a halt on rank 0 only, at one step: the verdict must still stop both ranks together."""

    name = "one_rank_tripwire"

    def __init__(self, at_step: int):
        self.at_step = at_step

    def observe(self, trainer, metrics):
        return "synthetic verdict" if rank() == 0 and trainer.step == self.at_step else None


def mode_tripwire(out: Path, name: str, at_step: int, **_):
    _halting(out, name, trainer(out / name, max_steps=12, checkpoint_every=0, callbacks=[OneRankTripwire(at_step)]))


def mode_dry(out: Path, name: str, at_step: int, **_):
    """Rank 1's data runs out after `at_step` windows, rank 0's does not: both must stop there, without a hang."""
    loader = rank_loader()
    if rank() == 1:
        loader = FiniteLoader(loader.batches[:at_step])
    t = build_sft(out / name, accum=ACCUM, strategy="fsdp", loader=loader, max_steps=12, checkpoint_every=0)
    record(out, name, t.fit(), t.step)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("modes", help="comma-separated MODE[:NAME]")
    ap.add_argument("out")
    ap.add_argument("--at-step", type=int, default=3)
    ap.add_argument("--victim", type=int, default=1)
    args = ap.parse_args()
    init_distributed()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for token in args.modes.split(","):
        mode, _, name = token.partition(":")
        fn = globals()[f"mode_{mode}"]
        if mode in ("equivalence", "resume"):
            fn(out)
        elif mode == "sigterm":
            fn(out, name, args.at_step, args.victim)
        else:
            fn(out, name, at_step=args.at_step)


if __name__ == "__main__":
    main()
    exit_process(0)  # no interpreter finalisation of live gloo state (align.utils.dist.exit_process)
