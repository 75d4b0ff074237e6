#!/usr/bin/env bash
# Build a Spark Connect client env: Spark's JVM-less client package (pyspark-client) instead of pyspark, and the rest
# of what the job's driver imports (setup.py's CLIENT list at constraints.txt's pins). No JVM, no py4j: what a
# Databricks serverless client or a laptop against an sc:// server has. tests/test_connect_session.py runs the job's
# command line from it against a Connect server started from the main venv's pyspark.
# Usage: scripts/make_client_env.sh [ENV_DIR]   (default: <repo>/.venv-client; PYTHON=... to choose the interpreter)
#
# Idempotent: a stamp file in ENV_DIR records what it was built with; same -> nothing to do, else rebuilt.
set -euo pipefail

REPO="$(cd "$(dirname "$0")/.." && pwd)"
ENV_DIR="${1:-$REPO/.venv-client}"
PYTHON="${PYTHON:-$(command -v python3.11 || echo python3)}"
STAMP="$ENV_DIR/.sparkseg-client-env"

mapfile -t REQUIREMENTS < <(cd "$REPO" && "$PYTHON" -c 'import setup; print("\n".join(setup.CLIENT))')
WANT="$(printf '%s\n' "$("$PYTHON" -c 'import sys; print(sys.version)')" "${REQUIREMENTS[@]}" \
        "$(grep -E '^pyspark-client==' "$REPO/constraints.txt")")"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
    exit 0
fi
rm -rf "$ENV_DIR"
"$PYTHON" -m venv "$ENV_DIR"
"$ENV_DIR/bin/python" -m pip install --no-compile -q -c "$REPO/constraints.txt" "${REQUIREMENTS[@]}"
if "$ENV_DIR/bin/python" -c 'import py4j' 2>/dev/null; then
    echo "make_client_env: py4j got into $ENV_DIR (a requirement pulled in pyspark): a client env has no JVM" >&2
    exit 1
fi
printf '%s' "$WANT" > "$STAMP"
