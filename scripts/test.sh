#!/usr/bin/env bash
# The whole test suite: the same set-up plus the test, oracle and triton extras and TRL 0.24 beside the venv (the PPO
# oracle), then pytest (default tier: everything not marked slow or gpu), then the smoke ladder (`doit profile=smoke smoke`).
# pytest runs one worker per core (pytest-xdist, at most 4: ALIGN_TEST_WORKERS overrides, 0 = in this process), a test
# file per worker at a time (`--dist loadfile`: a file's module fixtures are built once): much of the suite waits on
# child processes (ranks, doit, torchrun), so one worker leaves a core idle.
#   bash scripts/test.sh                 # everything
#   bash scripts/test.sh tests/pipeline  # arguments go to pytest (the smoke ladder still runs)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/_venv.sh
align_venv "test,oracle,triton"  # triton: the Triton kernels' interpreter tests (tests/kernels/test_triton_kernels.py)
align_trl_ppo_oracle  # TRL 0.24's PPO trainer beside the venv: tests/ppo/test_ppo_trl024_oracle.py

set +e
workers="${ALIGN_TEST_WORKERS:-$(( $(nproc) < 4 ? $(nproc) : 4 ))}"
"$VENV/bin/python" -m pytest -q -n "$workers" --dist loadfile "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
    # pytest's "no tests collected": an empty selection is not a failure of the code under test.
    echo "align: pytest collected no tests (exit 5); continuing" >&2
elif [ "$rc" -ne 0 ]; then
    echo "align: pytest failed (exit $rc)" >&2
    exit "$rc"
fi
exec "$VENV/bin/doit" profile=smoke smoke
