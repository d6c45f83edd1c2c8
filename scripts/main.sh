#!/usr/bin/env bash
# The main job: build the whole ladder of profile tiny (what exists of it) with doit.
#   bash scripts/main.sh                       # the ladder of profile tiny
#   ALIGN_PROFILE=smoke bash scripts/main.sh   # another profile; extra arguments go to doit (e.g. a task name)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/_venv.sh
align_venv ""
exec "$VENV/bin/doit" profile="${ALIGN_PROFILE:-tiny}" "$@"
