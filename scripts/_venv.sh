# Sourced by scripts/main.sh and scripts/test.sh: create or reuse the virtual environment and install align into it.
#   align_venv "EXTRAS"   e.g. align_venv "" or align_venv "test,oracle"
# Environment: PYTHON (default: python3.11, else python3), ALIGN_VENV (default: .venv in the repository).
# torch is pinned on every pip line: an unpinned resolver step could replace the CPU wheel with a multi-GB build.

ALIGN_TORCH="torch==2.13.0"

align_venv() {
    local extras="$1"
    local py="${PYTHON:-}"
    if [ -z "$py" ]; then
        if command -v python3.11 >/dev/null 2>&1; then py=python3.11; else py=python3; fi
    fi
    VENV="${ALIGN_VENV:-$PWD/.venv}"
    if [ ! -x "$VENV/bin/python" ]; then
        echo "align: creating $VENV with $py" >&2
        "$py" -m venv "$VENV"
    fi
    local spec="."
    [ -n "$extras" ] && spec=".[$extras]"
    # Skip pip when this exact pyproject.toml and extras were installed already (pip's own no-op check costs ~10 s).
    local stamp="$VENV/.align-installed"
    local want
    want="$(sha256sum pyproject.toml | cut -d' ' -f1) [$extras]"
    if ! grep -qxF "$want" "$stamp" 2>/dev/null; then
        echo "align: installing -e $spec into $VENV" >&2
        "$VENV/bin/python" -m pip install --quiet -e "$spec" "$ALIGN_TORCH"
        echo "$want" >> "$stamp"
    fi
    export PATH="$VENV/bin:$PATH"
}
