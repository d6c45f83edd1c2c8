"""align.utils.fsio and align.utils.manifest: atomic publication, staging cleanup, manifests written last."""

import json
import os
import subprocess
import sys

import pytest

from align.exceptions import ArtifactError
from align.utils.fsio import atomic_write_json, publish_dir, sha256_file, staging_dir
from align.utils.manifest import manifest_digest, read_manifest, write_manifest


def test_staging_publish_replaces_and_cleans_only_dead_partials(tmp_path):
    final = tmp_path / "art"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (tmp_path / f"art.partial-{dead.stdout.strip()}").mkdir()  # a writer that died
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / f"art.partial-{live.pid}").mkdir()  # a writer still running
        stage = staging_dir(final)
        (stage / "a.txt").write_text("one")
        publish_dir(stage, final)
        names = sorted(p.name for p in tmp_path.iterdir())
        assert names == ["art", f"art.partial-{live.pid}"]
    finally:
        live.kill()
        live.wait()
    stage = staging_dir(final)  # the now-dead writer's partial goes
    (stage / "b.txt").write_text("two")
    publish_dir(stage, final)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["art"] and os.listdir(final) == ["b.txt"]


def test_manifest_lists_files_and_refuses_damage(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "w.bin").write_bytes(b"abc")
    (tmp_path / "x.json").write_text("{}")
    m = write_manifest(tmp_path, "toy", inputs={"b": "2", "a": "1"}, extra={"step": 3})
    assert set(m["files"]) == {"sub/w.bin", "x.json"} and list(m["inputs"]) == ["a", "b"] and m["step"] == 3
    assert m["files"]["sub/w.bin"] == {"sha256": sha256_file(tmp_path / "sub" / "w.bin"), "bytes": 3}
    digest = manifest_digest(tmp_path)
    assert read_manifest(tmp_path, kind="toy", verify_hashes=True)["kind"] == "toy"
    with pytest.raises(ArtifactError, match="kind is 'toy', expected 'checkpoint'"):
        read_manifest(tmp_path, kind="checkpoint")
    (tmp_path / "sub" / "w.bin").write_bytes(b"abd")  # same size, other content
    read_manifest(tmp_path)
    with pytest.raises(ArtifactError, match="sha256 differs"):
        read_manifest(tmp_path, verify_hashes=True)
    (tmp_path / "x.json").unlink()
    with pytest.raises(ArtifactError, match="x.json: listed in .* but missing"):
        read_manifest(tmp_path)
    with pytest.raises(ArtifactError, match="no manifest.json"):
        read_manifest(tmp_path / "sub")
    assert len(digest) == 64
    with pytest.raises(ValueError, match="reserved"):
        write_manifest(tmp_path / "sub", "toy", extra={"files": 1})


def test_atomic_json_is_whole_or_absent(tmp_path):
    atomic_write_json(tmp_path / "d" / "r.json", {"b": 1, "a": [1, 2]})
    assert json.loads((tmp_path / "d" / "r.json").read_text()) == {"a": [1, 2], "b": 1}
    assert os.listdir(tmp_path / "d") == ["r.json"]  # no temporary left behind
