"""scripts/main.sh ends with the report: plain doit builds the ladder and then the `report` task, and the script's
last line is the page's absolute path; a failing ladder exits with doit's code and prints no path.

Run for real on the two-stage toy ladder (pipeline_toy.py): the repository's main.sh copied into the toy project
beside a scripts/_venv.sh that names this interpreter's environment instead of creating one (the venv setup is not
what is tested, and must not reinstall the shared environment)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline_toy import make_toy, write

pytestmark = pytest.mark.timeout(300)
REPO = Path(__file__).resolve().parents[2]
VENV_STUB = 'align_venv() {{ VENV="{prefix}"; export PATH="$VENV/bin:$PATH"; }}\n'


@pytest.fixture
def toy(tmp_path):
    root = make_toy(tmp_path / "toy")
    (root / "scripts").mkdir()
    shutil.copy(REPO / "scripts" / "main.sh", root / "scripts" / "main.sh")
    (root / "scripts" / "_venv.sh").write_text(VENV_STUB.format(prefix=sys.prefix))
    return root


def main_sh(root: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, ALIGN_PROFILE="toy", PYTHONDONTWRITEBYTECODE="1",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))  # this checkout's code
    env.pop("ALIGN_HEAVY_LOCK", None)
    return subprocess.run(["bash", str(root / "scripts" / "main.sh")], cwd=REPO, capture_output=True, text=True,
                          env=env, timeout=240)


def test_main_builds_the_ladder_then_the_report_and_prints_its_path_last(toy):
    page = (toy / "runs" / "toy" / "report" / "report.html").resolve()
    for attempt in ("first", "up to date"):
        res = main_sh(toy)
        assert res.returncode == 0, res.stdout + res.stderr
        lines = res.stdout.splitlines()
        assert lines[-1] == f"report: {page}", (attempt, res.stdout[-2000:])
        assert page.is_file() and "<td>shards</td>" in page.read_text()  # the toy has no rung: its tasks
    done = [line for line in main_sh(toy).stdout.splitlines() if line.startswith(("-- ", ".  "))]
    assert done == ["-- ingest", "-- shards", "-- report"]  # the report is plain doit's last task


def test_a_failing_ladder_exits_with_doits_code_and_prints_no_path(toy):
    write(toy, "configs/toy/ingest.toml", "include = 'job.toml'\n[job]\nfail = true\n")
    res = main_sh(toy)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "worker exited 1" in res.stderr
    assert not any(line.startswith("report:") for line in res.stdout.splitlines())
    assert not (toy / "runs" / "toy" / "report").exists()
