#!/usr/bin/env bash
# Build an env with what a Databricks notebook job runs sparkseg on: Databricks Runtime 17.3 LTS's versions of the
# libraries sparkseg imports from the Runtime, plus the libraries the notebook installs (its %pip cell:
# notebooks/databricks_requirements.txt), at the versions it names. make test-databricks runs the inference tests in
# it, the notebook on a Spark Connect session as on serverless or standard access mode.
# Usage: scripts/make_databricks_env.sh [ENV_DIR]   (default: <repo>/.venv-databricks; PYTHON=... to choose the
# interpreter, default python3.12 from the PATH)
#
# Why: the job runs the repository's code (a Git folder, not an installed wheel) with the Runtime's own numpy,
# pandas, pyarrow, Pillow, matplotlib and Spark, older than the main venv's. The Runtime's Spark is its own build of
# Apache Spark 4.0.0: here the pyspark wheel of that version, with the Runtime's Spark Connect client libraries.
#
# Idempotent: a stamp file in ENV_DIR records what it was built with; same -> nothing to do, else rebuilt.
set -euo pipefail

REPO="$(cd "$(dirname "$0")/.." && pwd)"
ENV_DIR="${1:-$REPO/.venv-databricks}"
# The first Python 3.12 found: PYTHON, python3.12 on the PATH (a pyenv shim there answers only where 3.12 is enabled),
# then pyenv's installed 3.12 versions, newest first
find_python312() {
    local candidate
    for candidate in ${PYTHON:-} python3.12 $(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12.*/bin/python3.12 2>/dev/null \
                                              | sort -rV); do
        if "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; then
            echo "$candidate"
            return
        fi
    done
    echo "${PYTHON:-python3.12}"
}
PYTHON="$(find_python312)"
STAMP="$ENV_DIR/.sparkseg-databricks-env"
REQUIREMENTS="$REPO/notebooks/databricks_requirements.txt"

# Databricks Runtime 17.3 LTS (Python 3.12): its versions of what sparkseg imports from the Runtime, and of the Spark
# Connect client's libraries. Spark 4.0.0: the Runtime's release notes
# (docs.databricks.com/aws/en/release-notes/runtime/17.3lts); the libraries: Databricks' pins for the Runtime, github
# databricks/environments, python/dbr/17.3.x-scala2.13/constraints.txt. numpy, pandas, pyarrow, Pillow and matplotlib
# are setup.py's lower bounds too where no other tested env has older ones (tests/test_deploy_notebooks.py).
RUNTIME_PINS=("pyspark==4.0.0" "numpy==2.1.3" "pandas==2.2.3" "pyarrow==19.0.1" "pillow==11.1.0" "matplotlib==3.10.0"
              "grpcio==1.67.0" "grpcio-status==1.67.0" "googleapis-common-protos==1.65.0" "protobuf==5.29.4")
# What the notebook's %pip cell installs (the requirements file's lines, comments dropped)
mapfile -t JOB_LIBRARIES < <(grep -vE '^\s*(#|$)' "$REQUIREMENTS")
# The test runner, at constraints.txt's versions (pytest.ini asks for --timeout)
TEST_PINS=($(grep -E '^(pytest|pytest-timeout)==' "$REPO/constraints.txt"))

if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))'; then
    echo "make_databricks_env: $PYTHON is $("$PYTHON" --version 2>&1); Databricks Runtime 17.3 LTS has Python 3.12:" \
         "install it (pyenv install 3.12) or run with PYTHON=/path/to/python3.12" >&2
    exit 1
fi
WANT="$(printf '%s\n' "$("$PYTHON" -c 'import sys; print(sys.version)')" "${RUNTIME_PINS[@]}" "${JOB_LIBRARIES[@]}" \
        "${TEST_PINS[@]}")"

start=$SECONDS
source "$REPO/scripts/env_lib.sh"
fresh_venv make_databricks_env "$ENV_DIR" "$STAMP" "$WANT" "$PYTHON"
# One resolution: a library of the notebook's %pip cell that needs a newer version of a Runtime library fails here,
# as it would replace the Runtime's on the cluster.
env_pip "$ENV_DIR" "${RUNTIME_PINS[@]}" "${JOB_LIBRARIES[@]}" "${TEST_PINS[@]}"

# No install of the repository: the notebook finds pipelines/ above itself, and tests run from the checkout.
"$ENV_DIR/bin/python" - <<'EOF'
import numpy, pandas, PIL, pyarrow, pyspark, grpc  # grpc: the Spark Connect client
print(f"make_databricks_env: numpy {numpy.__version__}, pandas {pandas.__version__}, pyarrow {pyarrow.__version__},"
      f" Pillow {PIL.__version__}, pyspark {pyspark.__version__}")
EOF
echo "$WANT" > "$STAMP"
echo "make_databricks_env: built $ENV_DIR in $((SECONDS - start)) s"
