#!/usr/bin/env bash
# The main job: build the whole ladder of profile tiny (what exists of it) with doit; it ends with the report.
#   bash scripts/main.sh                       # the ladder of profile tiny, then runs/tiny/report/report.html
#   ALIGN_PROFILE=smoke bash scripts/main.sh   # another profile; extra arguments go to doit (e.g. a task name)
# On success the last line is the report's path (`report: /abs/path/runs/<profile>/report/report.html`); on
# failure the script exits with doit's code (the failing worker's).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/_venv.sh
align_venv ""
profile="${ALIGN_PROFILE:-tiny}"
"$VENV/bin/doit" profile="$profile" "$@" || exit $?
exec "$VENV/bin/python" -m pipeline.report --profile "$profile" --root "$PWD" --where
