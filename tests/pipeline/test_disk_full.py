"""A full disk is named: ENOSPC during a shard build, a checkpoint save, a final publish or a receipt becomes one
`DiskFullError` line (the path, the bytes being written, the free space), exit 84, nothing half-written, and the
supervisor does not relaunch it. The disk is a real small tmpfs, mounted in a private user + mount namespace
(`unshare -rm`: no root needed where unprivileged user namespaces are allowed; skipped elsewhere)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from align.exit_codes import DISK_FULL
from pipeline_toy import calls, doit, make_toy, ran

ROOT = Path(__file__).resolve().parents[2]


def _unshare_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=4k none /mnt"],
                           capture_output=True)
    return probe.returncode == 0


pytestmark = pytest.mark.skipif(not _unshare_works(), reason="needs `unshare -rm` and a tmpfs mount")


LISTING = "--- files left on the tmpfs:"


def on_small_tmpfs(mount: Path, size: str, argv: list[str], cwd: Path = ROOT, fill: bool = False,
                   env_extra: dict | None = None) -> tuple[subprocess.CompletedProcess, list[str]]:
    """Run `argv` with a fresh tmpfs of `size` at `mount` (filled to the last byte first when `fill`); returns the
    result and what was left on the tmpfs afterwards (listed inside the namespace: the tmpfs dies with it)."""
    mount.mkdir(parents=True, exist_ok=True)
    filler = f'(cat /dev/zero > "{mount}/.filler") 2>/dev/null; ' if fill else ""
    script = (f'mount -t tmpfs -o size={size} none "{mount}" && {filler}"$@"; rc=$?; echo "{LISTING}"; '
              f'(cd "{mount}" && find . -mindepth 1 ! -name .filler | sort); exit $rc')
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONDONTWRITEBYTECODE="1", **(env_extra or {}))
    res = subprocess.run(["unshare", "-rm", "sh", "-c", script, "sh", *argv], cwd=cwd, capture_output=True,
                         text=True, env=env, timeout=300)
    left = res.stdout.split(LISTING, 1)[1].split() if LISTING in res.stdout else ["<no listing>"]
    return res, [p.removeprefix("./") for p in left]


def worker(code: str) -> list[str]:
    """A stage-like worker: `code` runs under run_with_exit_codes (exit code + one `align:` line)."""
    body = textwrap.indent(textwrap.dedent(code), "    ")
    program = (f"import sys\nfrom pathlib import Path\nfrom align.exit_codes import run_with_exit_codes\n"
               f"def main():\n    out = Path(sys.argv[1])\n{body}\n    return 0\n"
               f"raise SystemExit(run_with_exit_codes(main))\n")
    return [sys.executable, "-c", program]


def check_named(res: subprocess.CompletedProcess, path_part: str) -> str:
    assert res.returncode == DISK_FULL, res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    line = lines[0]
    assert line.startswith("align: disk full (84): ") and path_part in line
    assert "no space left on device while writing " in line and "bytes" in line
    assert "free on its filesystem: " in line
    return line


def test_shard_build_on_a_full_disk(tmp_path):
    mount = tmp_path / "disk"
    res, left = on_small_tmpfs(mount, "64k", [*worker("""
        import numpy as np
        from align.data.encoding import Encoded
        from align.data.store import write_shard
        rows = [Encoded(ids=(np.arange(40_000, dtype=np.int64) % 1000,), masks=(np.ones(40_000, dtype=np.uint8),))]
        write_shard(out, "shard-00000", rows, [{"id": "a", "group": "g", "content_hash": "h", "gold": None}],
                    np.dtype(np.uint16))
    """), str(mount)])
    line = check_named(res, f"{mount}/shard-00000")
    assert "while writing 117.2 KiB (120016 bytes)" in line  # 40k uint16 tokens + 40k mask bytes + 2 offsets
    assert left == []  # no partial .npy left behind (nor a done marker)


def test_checkpoint_save_on_a_full_disk(tmp_path):
    mount = tmp_path / "disk"
    res, left = on_small_tmpfs(mount, "256k", [*worker("""
        import torch
        from align.model import MistralConfig, MistralForCausalLM
        from align.model.checkpoint import save_checkpoint
        from align.train import checkpoint as ckpt_io
        model = MistralForCausalLM(MistralConfig(vocab_size=64, hidden_size=32, intermediate_size=48,
                                                 num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                                                 max_position_embeddings=64))
        weights = model.state_dict()
        ckpt_io.save_checkpoint(out / "checkpoints", 1, weights=weights,
                                write_weights=lambda s, d: save_checkpoint(model, d, state=s),
                                resume={"micro_step": 1, "ranks": [{}]}, module_state={"exp_avg": torch.ones(60_000)})
    """), str(mount)])
    check_named(res, f"{mount}/checkpoints/step_1: ")
    assert left == ["checkpoints"]  # no step_1, no .partial-<pid>


def test_final_publish_on_a_full_disk(tmp_path):
    mount = tmp_path / "disk"
    res, left = on_small_tmpfs(mount, "64k", [*worker("""
        from align.model import MistralConfig, MistralForCausalLM
        from align.model.checkpoint import save_checkpoint
        model = MistralForCausalLM(MistralConfig(vocab_size=512, hidden_size=64, intermediate_size=96,
                                                 num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                                                 max_position_embeddings=64))
        save_checkpoint(model, out / "final")
    """), str(mount)])
    check_named(res, f"{mount}/final: ")
    assert left == []


def test_training_refuses_up_front_when_the_disk_cannot_hold_the_run(tmp_path):
    mount = tmp_path / "disk"
    res, left = on_small_tmpfs(mount, "256k", [*worker("""
        from align.model import MistralConfig, MistralForCausalLM
        from align.train import checkpoint as ckpt_io
        model = MistralForCausalLM(MistralConfig(vocab_size=512, hidden_size=64, intermediate_size=96,
                                                 num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                                                 max_position_embeddings=64))
        ckpt_io.check_disk(out / "checkpoints", model, keep_last=2)
    """), str(mount)])
    assert res.returncode == 83, res.stderr
    line = res.stderr.strip()
    assert line.startswith("align: preflight refused (83): disk preflight: checkpoint ") and "x (keep_last 2 + 1" in line
    assert f"to write under {mount}/checkpoints, but its filesystem has 256.0 KiB" in line


def test_receipt_on_a_full_disk_fails_the_task_and_it_reruns(tmp_path):
    toy = make_toy(tmp_path / "toy")
    receipts = toy / "runs" / "toy" / "receipts"
    doit_argv = [sys.executable, "-m", "doit", "-f", str(toy / "dodo.py"), "profile=toy", "ingest"]
    res, left = on_small_tmpfs(receipts, "4k", doit_argv, cwd=toy, fill=True)
    assert res.returncode == DISK_FULL, res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("align: ")]
    assert len(lines) == 1 and "Traceback" not in res.stderr
    assert lines[0].startswith(f"align: ingest: receipt not written: {receipts}/ingest.json: no space left on device "
                               "while writing ")
    assert "free on its filesystem: 0 bytes" in lines[0]
    assert left == []  # no receipt, no .tmp
    seen = calls(toy)
    assert seen == ["ingest"]
    res = doit(toy, "ingest")  # doit did not record the task as done: it runs again and writes its receipt
    assert res.returncode == 0, res.stderr
    assert ran(toy, seen) == ["ingest"] and (receipts / "ingest.json").is_file()


def test_any_other_write_on_a_full_disk_is_named_too(tmp_path):
    mount = tmp_path / "disk"
    res, left = on_small_tmpfs(mount, "16k", [*worker("""
        from align.utils.tracking import MetricsHistory
        MetricsHistory(out / "history.jsonl").log(1, {"loss": 1.0, "note": "x" * 100_000})
    """), str(mount)])
    assert res.returncode == DISK_FULL, res.stderr
    line = res.stderr.strip()
    assert line.startswith(f"align: disk full (84): {mount}/history.jsonl: no space left on device while writing ")
    assert "Traceback" not in res.stderr
    res, left = on_small_tmpfs(mount, "16k", [*worker("""
        with open(out / "notes.txt", "w") as f:  # a write no align helper wraps: the error names no file
            f.write("x" * 100_000)
    """), str(mount)])
    assert res.returncode == DISK_FULL, res.stderr
    assert res.stderr.startswith("align: disk full (84): (a file its writer did not name): no space left on device")
    assert "free on its filesystem: unknown" in res.stderr and "Traceback" not in res.stderr
