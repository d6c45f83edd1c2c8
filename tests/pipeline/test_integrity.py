"""Outputs are verified before use: a file changed after its artifact was published (one flipped bit, same size)
is refused by every consumer, with the file and both sha256s, exit 2, and nothing built on it; the stat cache keeps
an unchanged artifact from being rehashed. `verify` lists intact / modified / missing; `--repair` is the way back."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import pytest
import torch

import align.utils.stat_cache as stat_cache
from align.exceptions import ArtifactError, CheckpointError
from align.model import MistralConfig, MistralForCausalLM
from align.model.checkpoint import load_checkpoint, save_checkpoint
from align.train import checkpoint as ckpt_io
from align.train.ref_cache import FILE as REF_FILE
from align.train.ref_cache import RefCache, RefCacheKey, build_ref_cache
from align.utils.manifest import verify_artifact, write_manifest
from pipeline import verify as verify_mod
from pipeline.layout import Project
from pipeline_toy import calls, doit, make_toy, ran


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(stat_cache.CACHE_ENV, str(tmp_path / "stat_cache"))


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def flip(path: Path, offset: int = -1, keep_mtime: bool = False) -> tuple[str, str]:
    """Flip the low bit of one byte in place (same size); returns (sha before, sha after)."""
    before = sha(path)
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[offset] ^= 1
    with open(path, "r+b") as f:
        f.write(data)
    if keep_mtime:  # put the old mtime back, as `touch -d` would: only ctime tells
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    return before, sha(path)


def artifact(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    write_manifest(root, "toy")
    return root


# ---------------------------------------------------------------------------------------------- the stat cache

def test_unchanged_file_is_not_rehashed_and_a_changed_one_is(tmp_path, monkeypatch):
    monkeypatch.setattr(stat_cache, "RACY_NS", 0)  # the files were written just now; see the racy test below
    art = artifact(tmp_path / "art", {"a.bin": b"x" * 4096, "sub/b.bin": b"y" * 100})
    hashed = []
    real = stat_cache.sha256_file
    monkeypatch.setattr(stat_cache, "sha256_file", lambda p: hashed.append(Path(p).name) or real(p))
    verify_artifact(art)
    assert sorted(hashed) == ["a.bin", "b.bin"]
    hashed.clear()
    verify_artifact(art)
    assert hashed == []  # one stat per file
    before, after = flip(art / "a.bin", keep_mtime=True)  # same size, same mtime: the ctime differs
    with pytest.raises(ArtifactError) as err:
        verify_artifact(art)
    assert hashed == ["a.bin"]
    message = str(err.value)
    assert f"{art / 'a.bin'}: sha256 differs" in message and after in message and before in message
    assert sorted(os.listdir(art)) == ["a.bin", "manifest.json", "sub"]  # the cache lives elsewhere


def test_a_file_written_within_the_racy_window_is_always_rehashed(tmp_path, monkeypatch):
    art = artifact(tmp_path / "art", {"a.bin": b"x" * 64})
    hashed = []
    real = stat_cache.sha256_file
    monkeypatch.setattr(stat_cache, "sha256_file", lambda p: hashed.append(1) or real(p))
    verify_artifact(art)
    verify_artifact(art)
    assert len(hashed) == 2  # mtime within 2 s of the hash: a same-tick rewrite would keep its stat


def test_a_torn_cache_file_only_costs_a_rehash(tmp_path, monkeypatch):
    monkeypatch.setattr(stat_cache, "RACY_NS", 0)
    art = artifact(tmp_path / "art", {"a.bin": b"x" * 64})
    verify_artifact(art)
    cache = stat_cache.StatCache(art)
    cache.path.write_text("{not json")
    verify_artifact(art)
    flip(art / "a.bin")
    with pytest.raises(ArtifactError, match="sha256 differs"):
        verify_artifact(art)


# ---------------------------------------------------------------------------------------------- the consumers

def tiny_model() -> MistralForCausalLM:
    torch.manual_seed(0)
    return MistralForCausalLM(MistralConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                            num_attention_heads=4, num_key_value_heads=2,
                                            max_position_embeddings=64)).eval()


def test_final_weights_with_a_flipped_bit_are_refused(tmp_path):
    final = save_checkpoint(tiny_model(), tmp_path / "final")
    load_checkpoint(final, device="cpu")
    before, after = flip(final / "model.safetensors", offset=-5)  # inside the tensor data, header intact
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(final, device="cpu")
    assert "model.safetensors: sha256 differs" in str(err.value)
    assert before in str(err.value) and after in str(err.value)


def test_resume_refuses_a_checkpoint_with_a_flipped_bit(tmp_path):
    model = tiny_model()
    weights = {k: v.clone() for k, v in model.state_dict().items()}

    def write_weights(state, out_dir):
        return save_checkpoint(model, out_dir, state=state)

    root = tmp_path / "checkpoints"
    for step in (1, 2):
        ckpt_io.save_checkpoint(root, step, weights=weights, write_weights=write_weights,
                                resume={"micro_step": step, "ranks": [{}]}, module_state={"t": torch.ones(8)})
    assert ckpt_io.latest_checkpoint(root).name == "step_2"
    before, after = flip(root / "step_2" / "resume.pt", offset=-30)
    with pytest.raises(CheckpointError) as err:  # never resumed, nor passed over for step_1 in silence
        ckpt_io.latest_checkpoint(root)
    assert "resume refused" in str(err.value) and "step_2/resume.pt: sha256 differs" in str(err.value)
    assert before in str(err.value) and after in str(err.value)
    before, after = flip(root / "step_2" / "model" / "model.safetensors", offset=-3)
    flip(root / "step_2" / "resume.pt", offset=-30)  # back to the published bytes: only the weights differ now
    with pytest.raises(CheckpointError, match=r"step_2/model/model\.safetensors: sha256 differs"):
        ckpt_io.latest_checkpoint(root)


def test_reference_cache_with_a_flipped_bit_is_refused(tmp_path):
    key = RefCacheKey(reference="r" * 64, shards="s" * 64, tokenizer="t" * 64, dtype="float32")
    rows = 6

    def score(batch):
        idx = batch["pair_index"].float()
        return -idx - 1, -idx - 2, torch.ones_like(idx, dtype=torch.int32), torch.ones_like(idx, dtype=torch.int32)

    path = tmp_path / "ref_cache"
    build_ref_cache(path, key, rows, [{"pair_index": torch.arange(rows)}], score)
    RefCache.open(path, key, rows)
    before, after = flip(path / REF_FILE, offset=-9)
    with pytest.raises(ArtifactError) as err:
        RefCache.open(path, key, rows)
    assert f"{REF_FILE}: sha256 differs" in str(err.value) and before in str(err.value) and after in str(err.value)


# ---------------------------------------------------------------------------------------------- the pipeline

@pytest.fixture
def toy(tmp_path):
    root = make_toy(tmp_path / "toy")
    sys.path.insert(0, str(root))  # toy_stages, for verify's in-process run
    yield root
    sys.path.remove(str(root))
    sys.modules.pop("toy_stages", None)


def toy_project(root: Path):
    import toy_stages

    return Project(root=root, packages=("toyalign",)), toy_stages.STAGES


def test_a_modified_input_refuses_its_consumer_then_verify_and_repair_rebuild_it(toy):
    assert doit(toy, "ingest").returncode == 0
    records = toy / "runs" / "toy" / "ingest" / "out" / "data.txt"
    assert records.read_text() == "HELLO LADDER!"
    before, after = flip(records, offset=3)  # "HELLO" -> "HELMO": same size, the manifest unchanged
    seen = calls(toy)
    res = doit(toy)  # ingest is up to date for doit (its targets' md5 did not change); shards must refuse
    assert res.returncode == 2, res.stderr
    line = [ln for ln in res.stderr.splitlines() if ln.startswith("align: ")]
    assert len(line) == 1 and "Traceback" not in res.stderr
    assert line[0].startswith("align: shards: input runs/toy/ingest/out was modified: ")
    assert f"{records}: sha256 differs" in line[0] and before in line[0] and after in line[0]
    assert "python -m pipeline.verify --profile toy --repair" in line[0]
    assert ran(toy, seen) == []  # the worker never started
    assert not (toy / "runs" / "toy" / "shards" / "out").exists()
    assert not (toy / "runs" / "toy" / "receipts" / "shards.json").exists()

    res = doit(toy, "verify")
    assert res.returncode == 2
    assert "modified ingest" in " ".join(res.stdout.split()) and "1 modified" in res.stdout

    project, stages = toy_project(toy)
    said = []
    assert verify_mod.run(project, "toy", do_repair=True, stages=stages, say=said.append) == 0
    assert any("repair: removed runs/toy/ingest/out" in s for s in said)
    res = doit(toy)
    assert res.returncode == 0, res.stderr
    assert ran(toy, seen) == ["ingest", "shards"]
    assert records.read_text() == "HELLO LADDER!"
    said.clear()
    assert verify_mod.run(project, "toy", stages=stages, say=said.append) == 0
    assert said[-1] == "verify: 2 intact, 0 modified, 0 missing"


def test_verify_lists_intact_modified_and_missing(toy):
    assert doit(toy, "ingest").returncode == 0
    project, stages = toy_project(toy)
    statuses = {s.artifact.task: s for s in verify_mod.verify_profile(project, "toy", stages)}
    assert (statuses["ingest"].state, statuses["shards"].state) == ("intact", "missing")
    flip(toy / "runs" / "toy" / "ingest" / "out" / "data.txt", offset=0)
    statuses = {s.artifact.task: s for s in verify_mod.verify_profile(project, "toy", stages)}
    assert statuses["ingest"].state == "modified" and "sha256 differs" in statuses["ingest"].detail
    (toy / "runs" / "toy" / "ingest" / "out" / "data.txt").unlink()
    statuses = {s.artifact.task: s for s in verify_mod.verify_profile(project, "toy", stages)}
    assert statuses["ingest"].state == "modified" and "missing" in statuses["ingest"].detail


def test_receipts_record_the_numerics_the_worker_ran_with(toy):
    assert doit(toy, "ingest").returncode == 0
    receipt = json.loads((toy / "runs" / "toy" / "receipts" / "ingest.json").read_text())
    assert receipt["numerics"]["env"]["MKL_DYNAMIC"] == os.environ.get("MKL_DYNAMIC", "FALSE")
    assert receipt["numerics"]["env"]["OMP_DYNAMIC"] == os.environ.get("OMP_DYNAMIC", "FALSE")
    manifest = json.loads((toy / "runs" / "toy" / "ingest" / "out" / "manifest.json").read_text())
    assert manifest["numerics"]["env"]["MKL_DYNAMIC"] == receipt["numerics"]["env"]["MKL_DYNAMIC"]
    assert manifest["numerics"]["cpu_count"] == os.cpu_count()
