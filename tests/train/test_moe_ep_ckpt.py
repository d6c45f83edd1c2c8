"""Expert-parallel checkpoints (worker: moe_ep_ckpt_worker.py; 2 gloo ranks, DDP, fp32 tiny OLMoE).

The file an ep = 2 run writes is the one an ep = 1 run writes (every tensor's name and shape; values within fp32
rounding of the run without EP), and it loads as an ordinary checkpoint. Resume: ep 2 -> 2 is bitwise the
uninterrupted ep-2 run; ep 2 -> 1 and ep 1 -> 2 (the experts' Adam moments resharded) end within fp32 rounding of
both uninterrupted runs, and each resumed run trained only steps 3 and 4. SIGTERM on one rank inside step 3 stops
both ranks (exit 143, a checkpoint written) and the resumed run is bitwise the uninterrupted ep-2 run."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "model"))
from gloo_ranks import run_ranks  # noqa: E402

pytestmark = pytest.mark.distributed
WORKER = Path(__file__).parent / "moe_ep_ckpt_worker.py"
RUNS = ("ep1", "ep2", "ep2_to_ep2", "ep2_to_ep1", "ep1_to_ep2", "ep2_sigterm")


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    out = tmp_path_factory.mktemp("moe_ep_ckpt")
    run_ranks(WORKER, 2, str(out), timeout=400)
    return out


def largest_difference(a: dict, b: dict) -> float:
    assert a.keys() == b.keys() and all(a[k].shape == b[k].shape for k in a)
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def test_ep_file_is_the_non_ep_file(out):
    from safetensors import safe_open

    from align.model.checkpoint import load_checkpoint

    files = {}
    for run in ("ep1", "ep2"):
        with safe_open(str(out / run / "checkpoints" / "step_2" / "model" / "model.safetensors"), "pt") as f:
            files[run] = {k: f.get_tensor(k) for k in f.keys()}
    assert any(".experts.7." in k or ".experts.3." in k for k in files["ep2"])  # the hub's per-expert keys
    assert largest_difference(files["ep2"], files["ep1"]) < 1e-6
    model = load_checkpoint(out / "ep2" / "checkpoints" / "step_2" / "model")
    assert model.model.layers[0].mlp.ep is None and model.model.layers[0].mlp.experts.gate_up_proj.shape[0] == 4


def test_resume_across_ep_values(out):
    from align.utils.tracking import read_history

    w = {run: torch.load(out / f"{run}.pt", weights_only=True) for run in RUNS}
    assert largest_difference(w["ep2"], w["ep1"]) < 1e-6
    assert largest_difference(w["ep2_to_ep2"], w["ep2"]) == 0.0
    for run in ("ep2_to_ep1", "ep1_to_ep2"):
        assert largest_difference(w[run], w["ep1"]) < 1e-6 and largest_difference(w[run], w["ep2"]) < 1e-6, run
        assert [r["step"] for r in read_history(out / run / "history.jsonl")] == [3, 4], run
        assert (out / f"{run}_resumed_rank0.txt").read_text() == "step_2", run


def test_sigterm_and_resume_is_bitwise_the_uninterrupted_run(out):
    assert [(out / f"ep2_sigterm_exit_rank{r}.txt").read_text() for r in range(2)] == ["143", "143"]
    w = {run: torch.load(out / f"{run}.pt", weights_only=True) for run in ("ep2", "ep2_sigterm")}
    assert largest_difference(w["ep2_sigterm"], w["ep2"]) == 0.0
    resumed = {(out / f"ep2_sigterm_resumed_rank{r}.txt").read_text() for r in range(2)}
    assert resumed in ({"step_2"}, {"step_3"}), resumed  # the last file is the resumed run's
