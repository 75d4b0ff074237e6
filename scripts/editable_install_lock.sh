#!/usr/bin/env bash
# Usage: scripts/editable_install_lock.sh CMD...: run CMD holding this checkout's editable-install lock
# (env_lib.sh's with_editable_install_lock says why).
set -euo pipefail
source "$(dirname "$0")/env_lib.sh"
with_editable_install_lock "$@"
