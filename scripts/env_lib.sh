# Shared by the scripts that build this repo's extra envs (make_bigdl_env.sh, make_databricks_env.sh): sourced.

# fresh_venv NAME ENV_DIR STAMP WANT PYTHON: end the calling script (exit 0) when ENV_DIR was built from WANT (its
# STAMP file holds it); else make ENV_DIR an empty venv of PYTHON, refusing a directory that is not a venv.
fresh_venv() {
    local name="$1" env_dir="$2" stamp="$3" want="$4" python="$5"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$env_dir/bin/python" ]; then
        echo "$name: $env_dir is up to date ($(du -sh "$env_dir" | cut -f1))"
        exit 0
    fi
    if [ -e "$env_dir" ] && [ ! -f "$env_dir/pyvenv.cfg" ] && [ -n "$(ls -A "$env_dir")" ]; then
        echo "$name: $env_dir exists and is not a venv: not deleting it; choose another ENV_DIR" >&2
        exit 1
    fi
    rm -rf "$env_dir"
    "$python" -m venv "$env_dir"
}

# quiet_pip ENV_DIR PIP-ARGS...: pip in ENV_DIR, quietly (any subcommand: install, wheel). The machine's pip config
# lists local indexes that may be absent: pip's warnings about those are dropped.
quiet_pip() {
    local env_dir="$1"
    shift
    "$env_dir/bin/python" -m pip "$1" --quiet --disable-pip-version-check "${@:2}" 2>&1 \
        | { grep -v "is ignored: it is neither a file nor a directory" || true; }
    return "${PIPESTATUS[0]}"
}

# env_pip ENV_DIR PIP-INSTALL-ARGS...: a quiet pip install into ENV_DIR.
env_pip() {
    quiet_pip "$1" install "${@:2}"
}

# with_editable_install_lock CMD...: CMD holding this checkout's editable-install lock. An editable install writes
# sparkseg.egg-info/ in the checkout, and `make test` builds the main venv and the BigDL env at once (the Makefile's
# EDITABLE_INSTALL_LOCK runs this through scripts/editable_install_lock.sh), so their installs take turns. Without
# flock (macOS, which has no BigDL env) CMD runs as it is.
with_editable_install_lock() {
    if ! command -v flock > /dev/null; then
        "$@"
        return
    fi
    (flock 9 && "$@") 9> "$(dirname "${BASH_SOURCE[0]}")/../.editable-install.lock"
}
