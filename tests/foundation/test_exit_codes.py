"""align.exit_codes: the codes, run_with_exit_codes (one line, no traceback for expected failures), and HALT.json
written atomically (a crash between write and rename leaves the old marker or none, never a partial one)."""

import json
import subprocess
import sys
import textwrap

import pytest

from align import exit_codes as X
from align.exceptions import ConfigError, DataError, ExitCodeError, HaltError, PreflightRefused


def test_codes_are_the_contract():
    assert (X.TRIPWIRE_HALT, X.NONFINITE_HALT, X.WALL_BUDGET, X.PREFLIGHT_REFUSED, X.BAD_INPUT) == (80, 81, 82, 83, 2)
    assert X.HALT_CODES == {80, 81, 82}
    assert PreflightRefused("x").exit_code == 83 and isinstance(PreflightRefused("x"), ExitCodeError)


@pytest.mark.parametrize("exc, code, text", [
    (HaltError("grad norm 1e9 > 1e4", 80), 80, "align: tripwire halt (80): grad norm 1e9 > 1e4"),
    (HaltError("4 consecutive skipped steps", 81), 81, "non-finite / skip-cap halt (81)"),
    (PreflightRefused("heavy-job lock held by pid 12"), 83, "preflight refused (83): heavy-job lock held by pid 12"),
    (ConfigError("a.toml: [train] unknown key 'x'"), 2, "align: ConfigError: a.toml: [train] unknown key 'x'"),
    (DataError("d.parquet: row 3, column 'answer': null"), 2, "DataError: d.parquet: row 3"),
])
def test_expected_failures_become_codes_and_one_line(capsys, exc, code, text):
    def main():
        raise exc

    assert X.run_with_exit_codes(main) == code
    err = capsys.readouterr().err
    assert text in err and err.count("\n") == 1 and "Traceback" not in err


def test_success_and_bugs():
    assert X.run_with_exit_codes(lambda: None) == 0 and X.run_with_exit_codes(lambda: 82) == 82
    with pytest.raises(ZeroDivisionError):  # a bug keeps its traceback
        X.run_with_exit_codes(lambda: 1 / 0)


def test_halt_marker_round_trip(tmp_path):
    X.write_halt_marker(tmp_path, 81, "skip cap: 4 consecutive")
    marker = X.read_halt_marker(tmp_path)
    assert marker["exit_code"] == 81 and marker["reason"] == "skip cap: 4 consecutive"
    assert X.read_halt_marker(tmp_path / "none") is None


CRASH_BEFORE_RENAME = textwrap.dedent("""
    import os, sys
    from align import exit_codes
    run_dir = sys.argv[1]
    if sys.argv[2] == "first":
        exit_codes.write_halt_marker(run_dir, 80, "first verdict")
    def crash(src, dst):  # the process dies after the data is written and fsynced, before the rename
        os._exit(9)
    os.replace = crash
    exit_codes.write_halt_marker(run_dir, 81, "second verdict " + "x" * 10000)
""")


@pytest.mark.parametrize("first", [True, False])
def test_halt_marker_survives_a_crash_between_write_and_rename(tmp_path, first):
    res = subprocess.run([sys.executable, "-c", CRASH_BEFORE_RENAME, str(tmp_path), "first" if first else "-"],
                         timeout=60)
    assert res.returncode == 9
    if first:
        marker = json.loads((tmp_path / "HALT.json").read_text())  # whole, parseable, the old verdict
        assert marker["exit_code"] == 80 and marker["reason"] == "first verdict"
    else:
        assert not (tmp_path / "HALT.json").exists()
    leftovers = [p.name for p in tmp_path.iterdir() if p.name != "HALT.json"]
    assert all(name.startswith(".HALT.json.tmp-") for name in leftovers)  # never under the marker's name


def test_exit_stage_leaves_with_the_verdict_and_lets_bugs_through_outside_a_process_group():
    assert not X.in_process_group()
    for main, code in ((lambda: None, 0), (lambda: 7, 7), (lambda: (_ for _ in ()).throw(DataError("row 3")), 2)):
        with pytest.raises(SystemExit) as exc:
            X.exit_stage(main)
        assert exc.value.code == code
    with pytest.raises(ZeroDivisionError):  # a bug keeps its traceback
        X.exit_stage(lambda: 1 / 0)
