#!/usr/bin/env bash
# Build the BigDL engine's own env (the `bigdl` engine cannot run in the main venv).
# Usage: scripts/make_bigdl_env.sh [ENV_DIR]        (default: <repo>/.venv-bigdl; PYTHON=python3.11 to choose)
#
# Why a second env: BigDL 2.4 (the last release) needs pyspark 3.5 (Scala 2.12), numpy<2, pyarrow<20 and the
# legacy `openvino.inference_engine` API (openvino <= 2023.3); the main venv has pyspark 4, numpy 2 and
# openvino 2026. The BigDL wheels pin pyspark==3.1.3, which does not run on Java 17 / Python 3.11, so they are
# installed with --no-deps on top of the pins below; `pip check` then reports that pin conflict, on purpose.
# Not installed: torch (executors never need it), bigdl-math / bigdl-tf (large, and not used by DLlib image
# preprocessing nor by the Orca OpenVINO Estimator).
#
# Idempotent: a stamp file in ENV_DIR records the pins it was built with; same pins -> nothing to do,
# other pins -> the env is rebuilt from nothing.
set -euo pipefail

REPO="$(cd "$(dirname "$0")/.." && pwd)"
ENV_DIR="${1:-$REPO/.venv-bigdl}"
PYTHON="${PYTHON:-python3}"
STAMP="$ENV_DIR/.sparkseg-bigdl-env"

# The engine's runtime: exact versions seen working together (docs/engines.md, BigDL).
RUNTIME_PINS=(
    "pyspark==3.5.8"          # 3.1/3.3: cloudpickle too old for py3.11; 4.x: Scala 2.13 (scala/Serializable)
    "numpy==1.26.4"           # BigDL calls ndarray.tostring (removed in numpy 2)
    "pyarrow==19.0.1"         # pyarrow >= 20 needs numpy 2
    "openvino==2023.3.0"      # the last release with openvino.inference_engine, which Orca's Estimator uses
    "six==1.17.0" "conda-pack==0.3.1" "pyzmq==26.2.0" "packaging==24.2" "filelock==3.16.1"  # BigDL's imports
)
BIGDL_PINS=("bigdl-dllib-spark3==2.4.0" "bigdl-orca-spark3==2.4.0" "bigdl-core==2.4.0.dev0")
# This repo's small runtime deps (setup.py CORE minus the above), in versions that work with numpy 1.26
# (pycocotools 2.0.10: 2.0.8 still pulls matplotlib), and the test runner (pytest.ini asks for --timeout).
REPO_PINS=(
    "pillow==11.3.0" "pyyaml==6.0.2" "pandas==2.2.3" "pycocotools==2.0.10" "fsspec==2024.12.0" "zlib-ng==1.1.0"
    "numba==0.68.1" "llvmlite==0.50.0" "pytest==8.3.5" "pytest-timeout==2.3.1"
)

if ! "$PYTHON" -c 'import sys; sys.exit(not ((3, 10) <= sys.version_info[:2] <= (3, 11)))'; then
    echo "make_bigdl_env: $PYTHON is $("$PYTHON" --version 2>&1); sparkseg needs Python >= 3.10 and openvino" \
         "2023.3 has wheels up to 3.11: run with PYTHON=python3.11" >&2
    exit 1
fi
WANT="$(printf '%s\n' "$("$PYTHON" -c 'import sys; print(sys.version)')" \
        "${RUNTIME_PINS[@]}" "${BIGDL_PINS[@]}" "${REPO_PINS[@]}" "natives: lib/bigdl-native")"

start=$SECONDS
source "$REPO/scripts/env_lib.sh"
fresh_venv make_bigdl_env "$ENV_DIR" "$STAMP" "$WANT" "$PYTHON"
env_pip "$ENV_DIR" "${RUNTIME_PINS[@]}" "${REPO_PINS[@]}"
env_pip "$ENV_DIR" --no-deps "${BIGDL_PINS[@]}"

# This repo, editable and without its deps (setup.py's CORE asks for the main venv's versions). setup.py reads
# README.md for the long description; while that file is missing, fall back to a .pth path entry (same effect).
# It takes turns with the main venv's editable install (`make test` builds both envs at once).
if [ -f "$REPO/README.md" ]; then
    with_editable_install_lock env_pip "$ENV_DIR" --no-deps -e "$REPO"
else
    echo "make_bigdl_env: $REPO/README.md missing (setup.py needs it): adding $REPO to the env's path instead"
    "$ENV_DIR/bin/python" -c 'import site, sys; open(site.getsitepackages()[0] + "/sparkseg-repo.pth", "w").write(sys.argv[1] + "\n")' "$REPO"
fi

# MKL and OpenCV out of BigDL's jar into the env, once: the JVMs load them from there instead of extracting them
# under /tmp each time they start (pipelines/engines/bigdl_natives.py says why).
"$ENV_DIR/bin/python" -m pipelines.engines.bigdl_natives

# Smoke test: the imports the engine needs, on the driver.
"$ENV_DIR/bin/python" -W ignore::FutureWarning - <<'EOF'
import numpy, pyspark, openvino.inference_engine  # noqa: F401
from bigdl.dllib.nnframes import NNModel  # noqa: F401
from bigdl.orca.learn.openvino import Estimator  # noqa: F401
import pipelines.engines.bigdl_engine  # noqa: F401
print(f"make_bigdl_env: numpy {numpy.__version__}, pyspark {pyspark.__version__}, BigDL + OpenVINO imports ok")
EOF

echo "$WANT" > "$STAMP"
echo "make_bigdl_env: built $ENV_DIR in $((SECONDS - start)) s, size $(du -sh "$ENV_DIR" | cut -f1)"
echo "make_bigdl_env: run BigDL jobs with $ENV_DIR/bin/python (PYSPARK_PYTHON=$ENV_DIR/bin/python)"
