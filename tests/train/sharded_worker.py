"""Worker for tests/train/test_sharded_checkpoint.py: two plain gloo ranks (env:// rendezvous), FSDP2, AdamW,
`checkpoint_format = "sharded"`.

Modes:
  resume   an uninterrupted 5-step run (checkpoints at 2, 4, 5), a run that crashes mid-window in step 4 on every
           rank, and its resume in a fresh Trainer; rank 0 saves <out>/resume.pt: both final weight sets and the
           uninterrupted run's gathered optimizer state (what the step_5 checkpoint holds)
  meta     the model built on the meta device, sharded, then filled shard by shard: equal to the model built
           whole, before and after 2 steps (<out>/meta.pt)
  plain    the same 5-step run in <out>/plain (resuming if it has checkpoints); rank 0 saves <out>/plain.pt with the
           final weights and the step it resumed from (a SIGKILL during a save comes from ALIGN_FAULTS)
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
torch.set_num_threads(1)

from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict  # noqa: E402

from align.utils.dist import exit_process, init_distributed, rank, world_size  # noqa: E402
from train_helpers import ListLoader, build_sft, crash_and_resume, sft_windows, weights  # noqa: E402

ACCUM = 2


def rank_loader(n_windows: int = 5) -> ListLoader:
    glob = sft_windows(n_windows, world_size() * ACCUM)
    return ListLoader([w[rank() * ACCUM:(rank() + 1) * ACCUM] for w in glob])


def trainer(run_dir, **kw):
    return build_sft(run_dir, accum=ACCUM, strategy="fsdp", loader=rank_loader(), max_steps=5, checkpoint_every=2,
                     checkpoint_format="sharded", **kw)


def full_optimizer_state(module) -> dict:
    """Every parameter's AdamW state, gathered (rank 0; {} elsewhere): collective."""
    _, osd = get_state_dict(module.model, module.optimizer,
                            options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return dict(osd.get("state", {}))


def mode_resume(out: Path) -> None:
    full = trainer(out / "full")
    assert full.fit() == 0
    w_full, opt_full = weights(full.module), full_optimizer_state(full.module)

    # step 4's second micro-batch: mid-window, after the step-2 checkpoint
    resumed = crash_and_resume(trainer, out / "cut", at_micro=3 * ACCUM + 2, resumed_from="step_2")
    w_resumed = weights(resumed.module)
    if rank() == 0:
        torch.save({"full": w_full, "resumed": w_resumed, "optimizer": opt_full}, out / "resume.pt")


def mode_plain(out: Path) -> None:
    t = trainer(out / "plain")
    assert t.fit() == 0
    w = weights(t.module)
    if rank() == 0:
        torch.save({"weights": w, "resumed_from": t.resumed_from.name if t.resumed_from else ""}, out / "plain.pt")


def mode_meta(out: Path) -> None:
    """The model built on the meta device, sharded, then each rank allocates and fills only its shard from the
    streamed full weights: the same weights, and the same 2 training steps, as the model built whole."""
    from train_helpers import tiny_model

    ref = tiny_model(0)
    full_weights = {k: v.clone() for k, v in ref.state_dict().items()}
    with torch.device("meta"):
        lazy = type(ref)(ref.config, init=False)
    built = build_sft(out / "built", accum=ACCUM, strategy="fsdp", loader=rank_loader(), max_steps=2,
                      checkpoint_every=0, model=ref)
    t = build_sft(out / "meta", accum=ACCUM, strategy="fsdp", loader=rank_loader(), max_steps=2, checkpoint_every=0,
                  model=lazy)
    shards = {n: p.to_local().numel() for n, p in lazy.named_parameters()}
    t.module.load_model_state_dict(iter(full_weights.items()))  # one full tensor at a time
    w_loaded = weights(t.module)
    assert built.fit() == 0 and t.fit() == 0
    w_built, w_meta = weights(built.module), weights(t.module)
    if rank() == 0:
        torch.save({"initial": full_weights, "loaded": w_loaded, "built": w_built, "meta": w_meta,
                    "shard_numel": shards, "full_numel": sum(p.numel() for p in ref.parameters())}, out / "meta.pt")


if __name__ == "__main__":
    init_distributed()
    mode, out = sys.argv[1], Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    for one in mode.split(","):  # several modes per launch: a start costs seconds on shared cores
        globals()[f"mode_{one}"](out)
    exit_process(0)  # no interpreter finalisation of live gloo state (align.utils.dist.exit_process)
