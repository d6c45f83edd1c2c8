"""Worker for tests/train/test_offload_adamw.py's 2-rank test (launched by torch.distributed.run, gloo, CPU).

FSDP2 over 2 ranks with `optimizer.name = "offload_adamw"`: an uninterrupted 4-step run (checkpoint every 2), a run
that crashes mid-window in step 4 on every rank, and its resume in a fresh Trainer from step 2. Rank 0 saves both
final weight sets and every rank's element counts (its local parameter shards, its host state) to <out>/ranks.pt.
The vocabulary is odd (257 rows): FSDP2 gives rank 0 ceil(257 / 2) rows of the embedding and head, rank 1 the rest.
`one_process_reference` is the same global windows (2 ranks x 2 micro-batches) as one window of 4 in one process."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))
torch.set_num_threads(1)

from align.utils.dist import exit_process, init_distributed, rank, world_size  # noqa: E402
from train_helpers import ListLoader, build_sft, crash_and_resume, sft_windows, tiny_model, weights  # noqa: E402

ACCUM = 2
STEPS = 4
VOCAB = 257  # odd: uneven FSDP2 shards


def one_process_reference(run_dir: Path, optimizer: str) -> dict:
    t = build_sft(run_dir, max_steps=STEPS, checkpoint_every=0, accum=2 * ACCUM, optimizer=optimizer,
                  loader=ListLoader(sft_windows(5, 2 * ACCUM)), model=tiny_model(0, vocab_size=VOCAB))
    assert t.fit() == 0
    return weights(t.module)


def rank_loader() -> ListLoader:
    glob = sft_windows(5, world_size() * ACCUM)
    return ListLoader([w[rank() * ACCUM:(rank() + 1) * ACCUM] for w in glob])


def trainer(run_dir: Path, fault=None):
    return build_sft(run_dir, max_steps=STEPS, checkpoint_every=2, accum=ACCUM, strategy="fsdp",
                     optimizer="offload_adamw", loader=rank_loader(), fault=fault, model=tiny_model(0, vocab_size=VOCAB))


def main(out: Path) -> None:
    full = trainer(out / "full")
    assert type(full.module.net).__name__ == "FSDPLossForward"
    assert full.fit() == 0
    w_full = weights(full.module)
    opt = full.module.optimizer
    counts = [None] * world_size()
    dist.all_gather_object(counts, {"state": sum(s["master"].numel() for s in opt.state.values()),
                                    "local": sum(p.to_local().numel() for p in full.module.model.parameters())})

    # step 4's second micro-batch: mid-window, after the step-2 checkpoint
    resumed = crash_and_resume(trainer, out / "cut", at_micro=3 * ACCUM + 2, resumed_from="step_2")
    w_resumed = weights(resumed.module)
    if rank() == 0:
        torch.save({"full": w_full, "resumed": w_resumed, "counts": counts}, out / "ranks.pt")


if __name__ == "__main__":
    init_distributed()
    main(Path(sys.argv[1]))
    exit_process(0)  # no interpreter finalisation of live gloo state (align.utils.dist.exit_process)
