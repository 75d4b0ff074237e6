#!/usr/bin/env bash
# check_free_space.sh WHAT [DIR GB]...: exit 1, naming each short directory, when the filesystem of a DIR has less
# than GB gigabytes free (pairs on one filesystem add up). `make test` runs it first: a suite that runs out of space
# half-way fails in scattered, misleading ways (tmp_path errors, dead JVMs, truncated files).
set -euo pipefail
what="$1"
shift
declare -A need_kb=() avail_kb=() dirs=()
while [ $# -gt 0 ]; do
    mkdir -p "$1"
    read -r device avail < <(df -Pk "$1" | awk 'NR == 2 {print $1, $4}')
    avail_kb[$device]="$avail"
    need_kb[$device]=$(( ${need_kb[$device]:-0} + $2 * 1024 * 1024 ))
    dirs[$device]="${dirs[$device]:+${dirs[$device]} and }$1"
    shift 2
done
short=0
for device in "${!need_kb[@]}"; do
    if [ "${avail_kb[$device]}" -lt "${need_kb[$device]}" ]; then
        echo "$what needs about $(( need_kb[$device] / 1024 / 1024 )) GB free for ${dirs[$device]} ($device);" \
             "it has $(( avail_kb[$device] / 1024 / 1024 )) GB. Free some space there (old checkouts, build/, dist/," \
             ".pytest-tmp/, leftover /tmp/spark-* directories) and run it again." >&2
        short=1
    fi
done
exit "$short"
