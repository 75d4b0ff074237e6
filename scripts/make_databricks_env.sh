#!/usr/bin/env bash
# Build an env with what a Databricks notebook job runs sparkseg on: Databricks Runtime 15.4 LTS's versions of the
# libraries sparkseg imports from the Runtime, plus the libraries notebooks/databricks_job.json installs, at the
# versions it names (make test-databricks runs the inference tests in it).
# Usage: scripts/make_databricks_env.sh [ENV_DIR]   (default: <repo>/.venv-databricks; PYTHON=... to choose the
# interpreter, default python3.11 from the PATH)
#
# Why: the job runs the repository's code (a Git folder, not an installed wheel) with the Runtime's own numpy,
# pandas, pyarrow, Pillow, matplotlib and Spark, older than the main venv's (numpy 2, pandas 2, pyspark 4). The
# Runtime's Spark is its own build of Apache Spark 3.5.0: here the pyspark wheel of that version.
#
# Idempotent: a stamp file in ENV_DIR records what it was built with; same -> nothing to do, else rebuilt.
set -euo pipefail

REPO="$(cd "$(dirname "$0")/.." && pwd)"
ENV_DIR="${1:-$REPO/.venv-databricks}"
PYTHON="${PYTHON:-$(command -v python3.11 || echo python3)}"
STAMP="$ENV_DIR/.sparkseg-databricks-env"
JOB_DEFINITION="$REPO/notebooks/databricks_job.json"

# Databricks Runtime 15.4 LTS (Python 3.11): its versions of what sparkseg imports from the Runtime. These are
# setup.py's lower bounds too: the oldest versions sparkseg is tested with. Spark 3.5.0: the Runtime's release notes
# (docs.databricks.com/aws/en/release-notes/runtime/15.4lts); the libraries: Databricks' pins for the Runtime, github
# databricks/environments, python/dbr/15.4.x-scala2.12/constraints.txt.
RUNTIME_PINS=("pyspark==3.5.0" "numpy==1.23.5" "pandas==1.5.3" "pyarrow==14.0.1" "pillow==9.4.0" "matplotlib==3.7.2")
# The job definition's libraries (its tasks' "libraries": what the job installs on the cluster)
mapfile -t JOB_LIBRARIES < <("$PYTHON" -c 'import json, sys
for task in json.load(open(sys.argv[1]))["tasks"]:
    for library in task.get("libraries", []):
        print(library["pypi"]["package"])' "$JOB_DEFINITION")
# The test runner, at constraints.txt's versions (pytest.ini asks for --timeout)
TEST_PINS=($(grep -E '^(pytest|pytest-timeout)==' "$REPO/constraints.txt"))

if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
    echo "make_databricks_env: $PYTHON is $("$PYTHON" --version 2>&1); Databricks Runtime 15.4 LTS has Python 3.11:" \
         "run with PYTHON=python3.11" >&2
    exit 1
fi
WANT="$(printf '%s\n' "$("$PYTHON" -c 'import sys; print(sys.version)')" "${RUNTIME_PINS[@]}" "${JOB_LIBRARIES[@]}" \
        "${TEST_PINS[@]}")"

start=$SECONDS
source "$REPO/scripts/env_lib.sh"
fresh_venv make_databricks_env "$ENV_DIR" "$STAMP" "$WANT" "$PYTHON"
# One resolution: a job library that needs a newer version of a Runtime library fails here, as it would replace
# the Runtime's on the cluster.
env_pip "$ENV_DIR" "${RUNTIME_PINS[@]}" "${JOB_LIBRARIES[@]}" "${TEST_PINS[@]}"

# No install of the repository: the notebook finds pipelines/ above itself, and tests run from the checkout.
"$ENV_DIR/bin/python" - <<'EOF'
import numpy, pandas, PIL, pyarrow, pyspark
print(f"make_databricks_env: numpy {numpy.__version__}, pandas {pandas.__version__}, pyarrow {pyarrow.__version__},"
      f" Pillow {PIL.__version__}, pyspark {pyspark.__version__}")
EOF
echo "$WANT" > "$STAMP"
echo "make_databricks_env: built $ENV_DIR in $((SECONDS - start)) s"
