"""`[train] checkpoint_format = "sharded"` (align.train.sharded_checkpoint): every rank writes its own DCP shard of
the weights and the optimizer state, nothing is gathered on rank 0. Two gloo ranks under FSDP2
(tests/train/sharded_worker.py): a crash mid-window resumes bitwise equal to an uninterrupted run; the 2-rank
checkpoint resumes in ONE process with the weights and AdamW moments equal to the gathered ones and training going
on; a SIGKILL during a sharded save leaves the previous checkpoint, which resumes bitwise; the streaming HF export
equals the gathered weights; a model built on the meta device is sharded before any rank allocates it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

from align.train import checkpoint as ckpt_io
from align.utils.manifest import verify_artifact
from align.utils.tracking import read_history
from train_helpers import assert_bitwise_equal, build_sft, weights

pytestmark = pytest.mark.distributed
ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).parent / "sharded_worker.py"
sys.path.insert(0, str(ROOT / "tests" / "model"))
from gloo_ranks import free_port  # noqa: E402


def launch(mode: str, out: Path, faults: str = "", timeout: float = 240) -> list[int]:
    """Two plain gloo ranks of the worker; their exit codes (a SIGKILLed rank: -9). Once one rank is killed, the
    other would wait at a collective for its peer: it is ended too (as torchrun ends a dead worker's peers)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port()), "WORLD_SIZE": "2", "CUDA_VISIBLE_DEVICES": "", "ALIGN_FAULTS": faults}
    procs = [subprocess.Popen([sys.executable, str(WORKER), mode, str(out)], cwd=ROOT, text=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}) for r in range(2)]
    deadline = time.monotonic() + timeout
    try:
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            if any(p.poll() == -9 for p in procs):
                time.sleep(2.0)
                for p in procs:
                    if p.poll() is None:
                        p.kill()
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    codes = [p.wait() for p in procs]
    if faults == "":
        for r, p in enumerate(procs):
            assert codes[r] == 0, f"rank {r} exited {codes[r]}:\n{p.stderr.read()[-3000:]}"
    return codes


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("sharded")
    launch("resume,meta", out)
    return out


def test_each_rank_writes_its_own_shard(runs):
    ckpt = runs / "full" / "checkpoints" / "step_5"
    assert ckpt_io.latest_checkpoint(runs / "full" / "checkpoints") == ckpt
    assert ckpt_io.checkpoint_layout(ckpt) == "sharded"
    names = {p.relative_to(ckpt).as_posix() for p in ckpt.rglob("*") if p.is_file()}
    assert {"dcp/__0_0.distcp", "dcp/__1_0.distcp", "dcp/.metadata", "resume.pt", "model/config.json"} <= names
    assert not any(n.endswith(".safetensors") or n.startswith("optimizer_rank") for n in names)  # no gather


def test_crash_mid_window_then_resume_is_bitwise_equal(runs):
    saved = torch.load(runs / "resume.pt", weights_only=True)
    assert_bitwise_equal(saved["full"], saved["resumed"])


def test_two_rank_checkpoint_resumes_in_one_process(runs, tmp_path):
    """DCP reshards: the FSDP2 shards of 2 ranks load into one unsharded process exactly, and training goes on."""
    saved = torch.load(runs / "resume.pt", weights_only=True)
    shutil.copytree(runs / "full" / "checkpoints", tmp_path / "checkpoints")
    t = build_sft(tmp_path, max_steps=7, checkpoint_every=0, checkpoint_format="sharded")
    assert t.resume().name == "step_5" and t.step == 5 and t.module.step == 5
    assert_bitwise_equal(saved["full"], weights(t.module))
    _, osd = get_state_dict(t.module.model, t.module.optimizer, options=StateDictOptions(full_state_dict=True))
    assert set(osd["state"]) == set(saved["optimizer"])
    for name, moments in saved["optimizer"].items():
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(osd["state"][name][key], moments[key]), (name, key)
    before = weights(t.module)
    t2 = build_sft(tmp_path, max_steps=7, checkpoint_every=0, checkpoint_format="sharded")
    assert t2.fit() == 0 and t2.resumed_from.name == "step_5" and t2.step == 7
    rows = read_history(tmp_path / "history.jsonl")
    assert [r["step"] for r in rows][-2:] == [6, 7] and all(torch.isfinite(torch.tensor(r["loss"])) for r in rows)
    assert any(not torch.equal(before[k], v) for k, v in weights(t2.module).items())  # it trained on
    assert ckpt_io.checkpoint_layout(ckpt_io.latest_checkpoint(tmp_path / "checkpoints")) == "sharded"


# one kill point in the default tier, the other with the slow fault-injection tier
@pytest.mark.parametrize("point", ["save:staged", pytest.param("save:manifest", marks=pytest.mark.slow)])
def test_sigkill_during_sharded_save_keeps_previous_and_resumes_bitwise(runs, tmp_path, point):
    """SIGKILL in step 4's save (after the shards are written / after the manifest, before the rename): step_2
    stays the newest complete checkpoint, and a relaunch resumes it to the uninterrupted run's weights."""
    codes = launch("plain", tmp_path, faults=f"kill@{point},step=4,rank=0")
    assert codes[0] == -9, codes
    root = tmp_path / "plain" / "checkpoints"
    assert ckpt_io.latest_checkpoint(root).name == "step_2"
    assert not (root / "step_4").exists() and list(root.glob("step_4.partial-*"))  # the dead writer's staging
    launch("plain", tmp_path)
    got = torch.load(tmp_path / "plain.pt", weights_only=True)
    assert got["resumed_from"] == "step_2"
    assert_bitwise_equal(torch.load(runs / "resume.pt", weights_only=True)["full"], got["weights"])
    assert not list(root.glob("step_4.partial-*"))  # the next save's pruning removed it


def test_streaming_hf_export_equals_the_gathered_weights(runs, tmp_path, monkeypatch):
    """The export reads the DCP shards one output file at a time and writes the family's HF layout; loading it
    gives exactly the weights the 2-rank run gathered. In-process with a small shard limit (several files, and
    no group read larger than the limit), then once through the CLI."""
    from align.model.checkpoint import CHECKPOINT_KIND, load_checkpoint
    from align.train import export_hf

    saved = torch.load(runs / "resume.pt", weights_only=True)["full"]
    step = runs / "full" / "checkpoints" / "step_5"
    limit = 40_000
    read = []
    real = export_hf.read_group
    monkeypatch.setattr(export_hf, "read_group", lambda c, p, keys: read.append(real(c, p, keys)) or read[-1])
    out = export_hf.export(step, tmp_path / "hf", max_shard_bytes=limit)
    sizes = [sum(t.numel() * t.element_size() for t in g.values()) for g in read]
    biggest = max(t.numel() * t.element_size() for t in saved.values())
    assert len(read) > 2 and max(sizes) <= max(limit, biggest) < sum(sizes)  # never the whole model at once
    assert len(list(out.glob("model-*.safetensors"))) == len(read)
    verify_artifact(out, kind=CHECKPOINT_KIND)  # every file against the manifest's sha256
    assert_bitwise_equal(saved, load_checkpoint(out).state_dict())

    proc = subprocess.run([sys.executable, "-m", "align.train.export_hf", "--checkpoint", str(step), "--out",
                           str(tmp_path / "cli")], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert_bitwise_equal(saved, load_checkpoint(tmp_path / "cli").state_dict())


def test_export_refuses_an_hf_layout_checkpoint(tmp_path):
    from align.exceptions import CheckpointError
    from align.train.export_hf import export

    t = build_sft(tmp_path / "run", max_steps=1, checkpoint_every=0)
    assert t.fit() == 0
    with pytest.raises(CheckpointError, match="not a sharded checkpoint"):
        export(tmp_path / "run" / "checkpoints" / "step_1", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_meta_device_model_is_sharded_before_it_is_allocated(runs):
    """No rank builds the full model: built on the meta device, sharded by FSDP2, each rank allocates its half and
    streams the full weights in one tensor at a time; the weights and two training steps equal the model built
    whole."""
    got = torch.load(runs / "meta.pt", weights_only=True)
    assert_bitwise_equal(got["initial"], got["loaded"])
    assert_bitwise_equal(got["built"], got["meta"])
    assert sum(got["shard_numel"].values()) <= 0.55 * got["full_numel"]  # rank 0 allocated about half


def test_per_rank_optimizer_state_is_refused_before_the_first_step(tmp_path):
    from align.exceptions import ConfigError

    t = build_sft(tmp_path, max_steps=2, optimizer="adamw8bit", checkpoint_format="sharded")
    with pytest.raises(ConfigError, match="adamw8bit|per-rank state"):
        t.fit()
    assert t.step == 0 and not (tmp_path / "checkpoints").exists()


def test_train_table_key_and_run_identity():
    """`[train] checkpoint_format` is read from the config, checked, and operational: switching it keeps the run
    identity, so the default ("hf") digests are what they were and a run may resume either layout."""
    from align.config import from_dict
    from align.exceptions import ConfigError
    from align.train.identity import OPERATIONAL_KEYS
    from align.train.trainer import TrainerConfig

    assert from_dict(TrainerConfig, {"max_steps": 3}).checkpoint_format == "hf"
    assert from_dict(TrainerConfig, {"max_steps": 3, "checkpoint_format": "sharded"}).checkpoint_format == "sharded"
    with pytest.raises(ConfigError, match="checkpoint_format must be one of"):
        from_dict(TrainerConfig, {"max_steps": 3, "checkpoint_format": "dcp"})
    assert "train.checkpoint_format" in OPERATIONAL_KEYS
