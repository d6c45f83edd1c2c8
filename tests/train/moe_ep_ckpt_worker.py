"""Worker of test_moe_ep_ckpt.py: two gloo ranks (env:// rendezvous). argv: out_dir.

4-step MoE SFT runs under DDP on rank r's share of the global windows (checkpoints at steps 2 and 4): with
expert_parallel 1 ("ep1") and 2 ("ep2"); then runs that start from a copy of one run's step-2 checkpoint under
another (or the same) ep value and finish the 4 steps: "ep2_to_ep2", "ep2_to_ep1", "ep1_to_ep2"; "ep2_sigterm": an
ep-2 run whose rank 1 gets SIGTERM inside step 3 (exit code to <out>/ep2_sigterm_exit_rank<r>.txt), then resumed
by a fresh Trainer. Rank 0 saves each run's final full weights to <out>/<run>.pt; the run directories stay under
<out>/<run>/."""

from __future__ import annotations

import os
import shutil
import signal
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
torch.set_num_threads(1)

from align.model.moe_ep import expert_parallel_groups  # noqa: E402
from align.train.moe_module import moe_module  # noqa: E402
from align.train.sft_module import SftTrainModule  # noqa: E402
from align.utils.dist import barrier, exit_process, init_distributed, rank  # noqa: E402
from dist_worker import ACCUM, rank_loader  # noqa: E402
from moe_train_helpers import tiny_moe  # noqa: E402
from train_helpers import build_sft, weights  # noqa: E402


def run(out: Path, name: str, ep: int, fault=None) -> int:
    groups = expert_parallel_groups(ep) if ep > 1 else None
    t = build_sft(out / name, accum=ACCUM, strategy="ddp", loader=rank_loader(), max_steps=4, checkpoint_every=2,
                  keep_last=10, model=tiny_moe(), base=moe_module(SftTrainModule), fault=fault,
                  parallel={"expert_parallel": ep}, module_kwargs={"ep_groups": groups})
    code = t.fit()
    (out / f"{name}_resumed_rank{rank()}.txt").write_text(t.resumed_from.name if t.resumed_from else "none")
    if code != 0:
        return code
    w = weights(t.module)
    if rank() == 0:
        torch.save(w, out / f"{name}.pt")
    return 0


def sigterm_in_step_3(module, batch, info, count=[0]):
    count[0] += 1
    if rank() == 1 and count[0] == 2 * ACCUM + 1:
        os.kill(os.getpid(), signal.SIGTERM)  # on one rank, inside step 3: both stop with a checkpoint


def main() -> None:
    init_distributed()
    out = Path(sys.argv[1])
    assert run(out, "ep1", 1) == 0
    assert run(out, "ep2", 2) == 0
    for src, ep in (("ep2", 2), ("ep2", 1), ("ep1", 2)):
        name = f"{src}_to_ep{ep}"
        if rank() == 0:
            shutil.copytree(out / src / "checkpoints" / "step_2", out / name / "checkpoints" / "step_2")
        barrier()
        assert run(out, name, ep) == 0
    stopped = run(out, "ep2_sigterm", 2, fault=sigterm_in_step_3)
    (out / f"ep2_sigterm_exit_rank{rank()}.txt").write_text(str(stopped))
    assert run(out, "ep2_sigterm", 2) == 0  # a fresh Trainer in the same run directory resumes


if __name__ == "__main__":
    main()
    exit_process(0)
