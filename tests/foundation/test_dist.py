"""align.utils.dist: world size 1 without a process group, and 2 gloo ranks on CPU."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from align.utils import dist as D

TWO_RANKS = textwrap.dedent("""
    import json, os, sys
    import torch.distributed as tdist
    from align.utils import dist as D
    assert D.init_distributed(run_dir=sys.argv[1]) and D.init_distributed()  # idempotent
    r, w = D.rank(), D.world_size()
    backend = tdist.group.WORLD._get_backend(D.device())
    flags = [0.0, 0.0, 0.0]
    flags[r] = 1.0            # a rank-local fact on each rank
    flags[2] = 5.0 if r == 1 else 0.0
    out = {"rank": r, "world": w, "max": D.all_reduce_max(flags).tolist(),
           "sum": D.all_reduce_sum([r + 1]).tolist(), "gather": D.all_gather_object(f"msg{r}"),
           "bcast": D.broadcast_object({"from": r}), "backend": tdist.get_backend(),
           "timeout_s": backend.options._timeout.total_seconds()}
    D.set_pg_timeout(30)
    out["shortened_s"] = backend.options._timeout.total_seconds()
    # NOTE: a live reference to the gloo backend outlives destroy_process_group, and its C++ threads are then torn
    # down during interpreter finalisation, which aborts the process now and then ("terminate called ...", -6).
    del backend
    D.barrier()
    with open(os.path.join(sys.argv[1], f"rank{r}.json"), "w") as f:
        f.write(json.dumps(out))
    D.destroy()
    D.exit_process(0)  # idempotent destroy, then no interpreter finalisation
""")


def test_single_process_needs_no_group(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert not D.init_distributed()
    assert (D.rank(), D.world_size(), D.is_rank0(), D.is_distributed()) == (0, 1, True, False)
    flags = [0, 1.5, True]
    out = D.all_reduce_max(flags)
    assert out.dtype == torch.float64 and out.tolist() == [0.0, 1.5, 1.0]
    t = torch.tensor([3.0])
    D.all_reduce_max(t).add_(1)
    assert t.item() == 3.0  # the caller's tensor is never modified
    assert D.all_gather_object("x") == ["x"] and D.broadcast_object(7) == 7
    D.barrier(), D.set_pg_timeout(5), D.destroy()  # no-ops without a group
    assert D.device().type == ("cuda" if torch.cuda.is_available() else "cpu")


def test_pg_timeout_from_environment(monkeypatch):
    monkeypatch.delenv(D.PG_TIMEOUT_ENV, raising=False)
    assert D.pg_timeout_s() == 1800.0
    monkeypatch.setenv(D.PG_TIMEOUT_ENV, "90")
    assert D.pg_timeout_s() == 90.0
    for bad in ("soon", "-3"):
        monkeypatch.setenv(D.PG_TIMEOUT_ENV, bad)
        with pytest.raises(ValueError, match="ALIGN_PG_TIMEOUT_S"):
            D.pg_timeout_s()


@pytest.mark.distributed
def test_two_gloo_ranks(tmp_path):
    import json

    env = dict(os.environ, OMP_NUM_THREADS="1", ALIGN_PG_TIMEOUT_S="120")
    script = tmp_path / "two_ranks.py"
    script.write_text(TWO_RANKS)
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                          str(script), str(tmp_path)], capture_output=True, text=True, env=env, timeout=240)
    errors = [line for line in res.stderr.splitlines() if "Error" in line or "error" in line]
    assert res.returncode == 0, "\n".join(errors[:20]) + "\n---\n" + res.stderr[-3000:]
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["rank"] for r in results] == [0, 1]
    for r in results:
        assert r["world"] == 2 and r["backend"] == "gloo" and (r["timeout_s"], r["shortened_s"]) == (120.0, 30.0)
        assert r["max"] == [1.0, 1.0, 5.0] and r["sum"] == [3.0]
        assert r["gather"] == ["msg0", "msg1"] and r["bcast"] == {"from": 0}


@pytest.mark.gpu
def test_a_rank_without_a_gpu_is_refused_by_name(monkeypatch):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    monkeypatch.setenv("LOCAL_RANK", str(torch.cuda.device_count()))
    with pytest.raises(RuntimeError, match="has no GPU"):
        D.device()
