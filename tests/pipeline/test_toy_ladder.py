"""The ladder frame, proven on a two-stage toy ladder in a temporary project with the real doit, launcher,
supervisor and subprocess workers: reruns follow content (data, config values, code), never mtimes; failures and
refusals leave nothing registered and exit with the worker's code."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from pipeline_toy import calls, doit, make_toy, ran, write

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A toy project after its first full build (shared by the read-only checks below)."""
    root = make_toy(tmp_path_factory.mktemp("toy"))
    res = doit(root)
    assert res.returncode == 0, res.stdout + res.stderr
    return root


@pytest.fixture
def toy(tmp_path):
    root = make_toy(tmp_path)
    res = doit(root)
    assert res.returncode == 0, res.stdout + res.stderr
    assert calls(root) == ["ingest", "shards"]
    return root


def test_list_shows_ladder_in_order_with_docs(built):
    res = doit(built, "list")
    lines = res.stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["ingest", "shards", "smoke", "report", "verify"]
    assert "upper-case the input text" in lines[0] and "count the characters" in lines[1]


def test_receipts_follow_the_contract(built):
    receipt = json.loads((built / "runs/toy/receipts/shards.json").read_text())
    assert set(receipt) >= {"task", "profile", "inputs", "outputs", "code_digest", "config_digest", "metrics",
                            "wall_s", "finished"}
    assert receipt["task"] == "shards" and receipt["profile"] == "toy"
    assert list(receipt["inputs"]) == ["runs/toy/ingest/out/manifest.json"]
    assert list(receipt["outputs"]) == ["runs/toy/shards/out/manifest.json"]
    assert receipt["metrics"] == {"chars": 3}  # "12#": the worker's metrics.json lands in the receipt
    assert 'suffix = "#"' in receipt["config"] and "sleep_s = 0.0" in receipt["config"]  # worker's resolved config
    log = (built / "runs/toy/shards/worker.log").read_text()
    assert "supervisor: attempt 1" in log


def test_nothing_reruns_when_up_to_date_or_only_mtimes_change(toy):
    before = calls(toy)
    future = time.time() + 100
    for rel in ("data/in.txt", "configs/toy/ingest.toml", "configs/toy/shards.toml", "toyalign/shout.py",
                "runs/toy/ingest/out/manifest.json"):
        os.utime(toy / rel, (future, future))
    res = doit(toy)
    assert res.returncode == 0 and ran(toy, before) == []
    assert "-- ingest" in res.stdout and "-- shards" in res.stdout


def test_upstream_data_change_reruns_downstream(toy):
    before = calls(toy)
    write(toy, "data/in.txt", "hello longer ladder")
    assert doit(toy).returncode == 0
    assert ran(toy, before) == ["ingest", "shards"]
    assert (toy / "runs/toy/shards/out/data.txt").read_text() == "20#"


def test_config_value_reruns_only_its_stage_and_comments_rerun_nothing(toy):
    before = calls(toy)
    write(toy, "configs/toy/shards.toml", "# edited comment\n[job]\nsuffix = '#'\n")
    assert doit(toy).returncode == 0 and ran(toy, before) == []
    write(toy, "configs/toy/shards.toml", "[job]\nsuffix = '%'\n")
    assert doit(toy).returncode == 0 and ran(toy, before) == ["shards"]
    # an included file is part of the config too
    before = calls(toy)
    write(toy, "configs/toy/job.toml", "[job]\nsuffix = '?'\n")
    assert doit(toy).returncode == 0 and ran(toy, before) == ["ingest", "shards"]


def test_worker_code_change_reruns_that_stage_and_what_follows(toy):
    before = calls(toy)
    write(toy, "toyalign/tally.py", "def tally(text, job):\n    return f'{len(text)} chars{job.suffix}'\n")
    assert doit(toy).returncode == 0 and ran(toy, before) == ["shards"]  # ingest's closure lacks tally.py
    before = calls(toy)
    write(toy, "toyalign/shout.py", "def shout(text, job):\n    return text.upper() + job.suffix * 2\n")
    assert doit(toy).returncode == 0 and ran(toy, before) == ["ingest", "shards"]


def test_worker_failure_registers_nothing_and_exits_nonzero(toy):
    write(toy, "configs/toy/ingest.toml", "include = 'job.toml'\n[job]\nfail = true\n")
    before = calls(toy)
    res = doit(toy)
    assert res.returncode == 1 and ran(toy, before) == ["ingest"]  # no progress: not relaunched; shards not run
    assert "worker exited 1" in res.stderr
    assert not (toy / "runs/toy/receipts/ingest.json").exists()
    status = doit(toy, "list", "--status").stdout
    assert "R ingest" in status and "U shards" in status  # shards' input (the old ingest manifest) is unchanged


def test_worker_killed_mid_write_leaves_no_target_registered(toy):
    write(toy, "data/in.txt", "changed input")
    write(toy, "configs/toy/ingest.toml", "include = 'job.toml'\n[job]\nsleep_s = 60.0\n")
    proc = subprocess.Popen([sys.executable, "-m", "doit", "-f", str(toy / "dodo.py"), "profile=toy"], cwd=toy,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    marker = toy / "runs/toy/ingest/WRITING"
    deadline = time.monotonic() + 60
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.exists()
    os.kill(int(marker.read_text()), signal.SIGKILL)  # the worker dies with its staging directory half-written
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 137, out + err  # the worker's own status (128 + SIGKILL)
    assert (toy / "runs/toy/ingest/out/data.txt").read_text() == "HELLO LADDER!"  # old artifact untouched
    assert list((toy / "runs/toy/ingest").glob("out.partial-*"))  # the half-written staging dir, never published
    assert not (toy / "runs/toy/receipts/ingest.json").exists()
    status = doit(toy, "list", "--status").stdout
    assert "R ingest" in status and "U shards" in status  # shards' input (the old ingest manifest) is unchanged
    write(toy, "configs/toy/ingest.toml", "include = 'job.toml'\n")
    before = calls(toy)
    assert doit(toy).returncode == 0 and ran(toy, before) == ["ingest", "shards"]
    assert not list((toy / "runs/toy/ingest").glob("out.partial-*"))


def test_held_lock_refuses_heavy_stage_with_83(toy):
    from align.utils.guard import HeavyJobLock

    write(toy, "configs/toy/shards.toml", "[job]\nsuffix = '+'\n")
    with HeavyJobLock(toy / "heavy.lock", command="someone else's training run"):
        before = calls(toy)
        res = doit(toy)
    assert res.returncode == 83, res.stdout + res.stderr
    line = [ln for ln in res.stderr.splitlines() if ln.startswith("align:")]
    assert len(line) == 1 and f"pid {os.getpid()}" in line[0] and "someone else's training run" in line[0]
    assert "Traceback" not in res.stderr and ran(toy, before) == []
    assert doit(toy).returncode == 0 and ran(toy, before) == ["shards"]


def test_preflight_refusal_is_83(toy):
    write(toy, "configs/toy/common.toml", "[preflight]\nmin_free_disk_gib = 1e12\n[lock]\npath = 'heavy.lock'\n")
    write(toy, "configs/toy/shards.toml", "[job]\nsuffix = '+'\n")
    res = doit(toy)
    assert res.returncode == 83 and "free disk" in res.stderr and "Traceback" not in res.stderr


@pytest.mark.parametrize("text, expected", [
    ("[job]\nsufix = '#'\n", "unknown key 'sufix'"),
    ("[job\nsuffix = 1\n", "malformed TOML"),
    ("[job]\nsleep_s = 'long'\n", "job.sleep_s: expected float"),
])
def test_bad_config_is_one_line_and_exit_2(tmp_path, text, expected):
    root = make_toy(tmp_path)
    write(root, "configs/toy/ingest.toml", text)
    res = doit(root, "ingest")
    assert res.returncode == 2, res.stdout + res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("align:")]
    assert len(lines) == 1 and expected in lines[0] and "configs/toy/ingest.toml" in lines[0]
    assert "Traceback" not in res.stderr and calls(root) == []


def test_unknown_profile_and_missing_config(tmp_path):
    root = make_toy(tmp_path)
    res = subprocess.run([sys.executable, "-m", "doit", "-f", str(root / "dodo.py"), "profile=nope", "list"],
                         cwd=root, capture_output=True, text=True, timeout=60)
    assert res.returncode == 3 and "unknown profile 'nope'" in res.stderr and "known profiles: toy" in res.stderr
    assert "Traceback" not in res.stderr
    (root / "configs/toy/shards.toml").unlink()
    res = doit(root)
    assert res.returncode == 2 and "config file not found" in res.stderr and calls(root) == ["ingest"]


def test_plain_doit_smoke_delegates_to_the_smoke_profile(tmp_path):
    root = make_toy(tmp_path)
    for src in (root / "configs/toy").iterdir():
        write(root, f"configs/smoke/{src.name}", src.read_text())
    res = subprocess.run([sys.executable, "-m", "doit", "-f", str(root / "dodo.py"), "profile=toy", "smoke"],
                         cwd=root, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    summary = json.loads((root / "runs/smoke/receipts/smoke.json").read_text())
    assert set(summary["tasks"]) == {"ingest", "shards"} and summary["tasks"]["shards"]["metrics"] == {"chars": 3}
    assert "sft_checkpoint" in summary["stages_not_declared"]
    assert not (root / "runs/toy/receipts").exists()  # profile toy itself was not built


@pytest.mark.distributed
def test_distributed_stage_launches_world_size_ranks(toy):
    write(toy, "configs/toy/common.toml", "[run]\nworld_size = 2\n[lock]\npath = 'heavy.lock'\n"
                                          "[preflight]\nmin_mem_available_gib = 0.01\n")
    before = calls(toy)
    res = doit(toy, env_extra={"OMP_NUM_THREADS": "1"})
    assert res.returncode == 0, res.stdout + res.stderr
    assert sorted(ran(toy, before)) == ["shards", "shards@1"]  # a launch change reruns the stage, on 2 ranks
    assert "torch.distributed.run" in json.loads((toy / "runs/toy/receipts/shards.json").read_text())["argv"]


def test_ctrl_c_is_forwarded_and_stops_the_whole_run(toy):
    write(toy, "data/in.txt", "changed input")
    write(toy, "configs/toy/ingest.toml", "include = 'job.toml'\n[job]\nsleep_s = 60.0\n")
    before = calls(toy)
    proc = subprocess.Popen([sys.executable, "-m", "doit", "-f", str(toy / "dodo.py"), "profile=toy"], cwd=toy,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    marker = toy / "runs/toy/ingest/WRITING"
    deadline = time.monotonic() + 60
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)  # to doit only: the worker runs in its own process group
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGINT, out + err  # the worker's status, after doit saved its state
    assert ran(toy, before) == ["ingest"] and "supervisor was signalled" in out
    assert (toy / "runs/toy/ingest/out/data.txt").read_text() == "HELLO LADDER!"
    assert "R ingest" in doit(toy, "list", "--status").stdout


def test_incomplete_ladder_builds_what_can_run(tmp_path):
    root = make_toy(tmp_path)
    for src in (root / "configs/toy").iterdir():
        write(root, f"configs/smoke/{src.name}", src.read_text())
    env = {"TOY_BLOCKED": "1"}
    assert "sft_checkpoint" in doit(root, "list", env_extra=env).stdout
    res = doit(root, env_extra=env)
    assert res.returncode == 0 and calls(root) == ["ingest", "shards"], res.stdout + res.stderr
    res = doit(root, "sft_checkpoint", env_extra=env)
    assert res.returncode == 2 and "input runs/toy/pretrain/manifest.json does not exist" in res.stderr
    res = subprocess.run([sys.executable, "-m", "doit", "-f", str(root / "dodo.py"), "profile=smoke", "smoke"],
                         cwd=root, capture_output=True, text=True, timeout=120, env=dict(os.environ, **env))
    assert res.returncode == 0, res.stdout + res.stderr
    summary = json.loads((root / "runs/smoke/receipts/smoke.json").read_text())
    assert set(summary["tasks"]) == {"ingest", "shards"}
    assert summary["tasks_blocked"] == {"sft_checkpoint": str(root / "runs/smoke/pretrain/manifest.json")}


def test_extra_rung_is_built_only_when_named(toy):
    env = {"TOY_EXTRA": "1"}
    assert "ppo_checkpoint" in doit(toy, "list", env_extra=env).stdout
    res = doit(toy, env_extra=env)
    assert res.returncode == 0 and calls(toy) == ["ingest", "shards"], res.stdout + res.stderr
    res = doit(toy, "report", env_extra=env)  # the report sums up what is built; it builds no extra rung
    assert res.returncode == 0 and calls(toy) == ["ingest", "shards"], res.stdout + res.stderr
    res = doit(toy, "ppo_checkpoint", env_extra=env)
    assert res.returncode == 0 and calls(toy) == ["ingest", "shards", "shards"], res.stdout + res.stderr  # its worker
    assert (toy / "runs/toy/ppo_checkpoint/out/manifest.json").is_file()
