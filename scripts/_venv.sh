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

# TRL 0.24.0, the last TRL with a PPO trainer: the oracle of tests/ppo/test_ppo_trl024_oracle.py, which runs it in a
# subprocess with this directory first on sys.path (the venv's own TRL is newer and has no PPO). `--no-deps --target`
# installs exactly this one pure-python wheel beside the venv: nothing it names (torch, transformers) is resolved,
# so no pin is needed and the venv is untouched. Stamp-checked like align_venv: a second call runs no pip.
#   align_trl_ppo_oracle     (after align_venv; the directory is .oracle/trl-0.24 in the repository)
ALIGN_TRL_PPO_ORACLE="trl==0.24.0"

align_trl_ppo_oracle() {
    local dir="$PWD/.oracle/trl-0.24"
    local stamp="$dir/.align-installed"
    if ! grep -qxF "$ALIGN_TRL_PPO_ORACLE" "$stamp" 2>/dev/null; then
        echo "align: installing $ALIGN_TRL_PPO_ORACLE (no dependencies) into $dir" >&2
        rm -rf "$dir"
        "$VENV/bin/python" -m pip install --quiet --no-deps --target "$dir" "$ALIGN_TRL_PPO_ORACLE"
        echo "$ALIGN_TRL_PPO_ORACLE" > "$stamp"
    fi
}
