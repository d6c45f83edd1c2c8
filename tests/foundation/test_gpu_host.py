"""GPU side of dist and guard (marked gpu; skipped without CUDA): NCCL init with the flight recorder armed under the
run directory, all_reduce_max on device, and the preflight's nvidia-smi reading."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

pytestmark = pytest.mark.gpu

NCCL = textwrap.dedent("""
    import json, os, sys
    import torch.distributed as tdist
    from align.utils import dist as D
    assert D.init_distributed(run_dir=sys.argv[1])
    out = {"backend": tdist.get_backend(), "max": D.all_reduce_max([0.0, 2.0]).tolist(),
           "device": str(D.device()), "trace": os.environ.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE")}
    D.set_pg_timeout(60)
    open(os.path.join(sys.argv[1], "out.json"), "w").write(json.dumps(out))
    D.destroy()
""")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_nccl_one_rank_with_flight_recorder(tmp_path):
    script = tmp_path / "nccl.py"
    script.write_text(NCCL)
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1",
                          str(script), str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["backend"] == "nccl" and out["max"] == [0.0, 2.0] and out["device"] == "cuda:0"
    assert out["trace"] == str(tmp_path / "nccl_trace" / "rank_") and (tmp_path / "nccl_trace").is_dir()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_preflight_reads_gpu_memory(tmp_path):
    from align.exceptions import PreflightRefused
    from align.utils.guard import PreflightConfig, free_gpu_gib, preflight

    free = free_gpu_gib()
    assert len(free) >= 1 and all(f > 0 for f in free)
    with pytest.raises(PreflightRefused, match="GPU 0 free memory"):
        preflight(PreflightConfig(min_free_gpu_gib=1e6), tmp_path)
