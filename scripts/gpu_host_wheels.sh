#!/usr/bin/env bash
# The Python packages scripts/bench_gpu_host.sh needs on a GPU host that has python3 with torch (CUDA), numpy,
# Pillow, pyarrow, pandas, numba, onnx and onnxruntime but no network and no project env: OpenVINO (pruned to its
# CPU plugin and its IR, ONNX and PyTorch front ends), openvino-telemetry, pycocotools, onnxslim,
# zlib-ng, at constraints.txt's versions, for that host's Python.
#
#   scripts/gpu_host_wheels.sh .whl            # then copy .whl and this checkout to the host
#   PYTHON_VERSION=3.11 scripts/gpu_host_wheels.sh .whl
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/gpu_host_wheels.sh OUT_DIR}
python_version=${PYTHON_VERSION:-3.12}
pin() { grep -i "^$1==" constraints.txt; }
mkdir -p "$out"
out=$(cd "$out" && pwd)
download() {
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$python_version" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$1" "${@:2}" 2>&1 | grep -v "^WARNING: Location" || true
}
download "$out" "$(pin openvino-telemetry)" "$(pin pycocotools)" "$(pin onnxslim)" "$(pin zlib-ng)"
staging=$(mktemp -d)
trap 'rm -rf "$staging"' EXIT
download "$staging" "$(pin openvino)"
(cd "$staging" && unzip -q openvino-*.whl && rm openvino-*.whl \
  && rm -f openvino/libs/libopenvino_intel_gpu_plugin.so openvino/libs/libopenvino_intel_npu_plugin.so \
       openvino/libs/cache.json openvino/libs/libopenvino_tensorflow*_frontend.so* \
       openvino/libs/libopenvino_paddle_frontend.so* openvino/libs/libopenvino_gguf_frontend.so* \
       openvino/libs/libopenvino_jax_frontend.so* \
  && rm -rf openvino/frontend/tensorflow openvino/frontend/paddle openvino/frontend/jax \
  && rm -f "$out/openvino-pruned.zip" && zip -q -r -9 "$out/openvino-pruned.zip" .)
ls -la "$out"
