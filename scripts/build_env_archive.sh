#!/usr/bin/env bash
# Pack a relocatable Python environment for the cluster: `spark-submit --archives <archive>#environment` with
# PYSPARK_PYTHON=./environment/bin/python (Spark's documented way on YARN, Kubernetes and standalone).
#
# Usage:
#   scripts/build_env_archive.sh                         # fresh env: sparkseg + inference deps -> dist/sparkseg-env.tar.gz
#   scripts/build_env_archive.sh --from-venv .venv-bigdl --output dist/sparkseg-bigdl-env.tar.gz
# Options:
#   --output FILE          the archive (default dist/sparkseg-env.tar.gz)
#   --from-venv DIR        pack an existing venv (e.g. the BigDL env) instead of building one; its editable sparkseg
#                          (a path on this machine) is replaced by a copy of pipelines/ and model_export/
#   --python-prefix DIR    where Python lives on the cluster nodes when it differs from this machine (venv-pack
#                          rewrites the interpreter link); default: the same path as here
#   --extras LIST          setup.py extras to include (default "azure": the Azure SDK reader/writer); "" for none
#   --force                rebuild even when the archive is up to date
# Environment: PYTHON (interpreter the fresh env is made from, default python3: the same major.minor as the
# driver's), PACKER_PYTHON (a Python with venv-pack, default <repo>/.venv/bin/python), SMOKE_IMPORTS (modules the
# packed env must import; default "numpy openvino pandas pyarrow PIL pycocotools zlib_ng numba pipelines").
#
# What is in the fresh env: this package (not editable) and setup.py's CORE deps plus the extras, at the versions of
# constraints.txt; NOT torch (executors never need it) and NOT pyspark/py4j (the cluster's Spark puts its own
# pyspark.zip on the workers' PYTHONPATH; a second copy would only add its size and a version to keep in step).
# venv-pack keeps bin/python as a link to the base interpreter: every node needs that Python at that path (or at
# --python-prefix). Idempotent: the archive is rebuilt only when its inputs (sources, setup.py, constraints, options)
# changed; `<archive>.inputs` records them.
set -euo pipefail

REPO="$(cd "$(dirname "$0")/.." && pwd)"
OUTPUT="$REPO/dist/sparkseg-env.tar.gz"
FROM_VENV=""
PYTHON_PREFIX=""
EXTRAS="azure"
FORCE=0
while [ $# -gt 0 ]; do
    case "$1" in
        --output) OUTPUT="$2"; shift 2 ;;
        --from-venv) FROM_VENV="$2"; shift 2 ;;
        --python-prefix) PYTHON_PREFIX="$2"; shift 2 ;;
        --extras) EXTRAS="$2"; shift 2 ;;
        --force) FORCE=1; shift ;;
        -h|--help) sed -n '2,26p' "$0"; exit 0 ;;
        *) echo "build_env_archive: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
PYTHON="${PYTHON:-python3}"
# A checkout on PYTHONPATH would make the fresh env's pip find sparkseg "already installed" (the checkout's egg-info)
# and pack an env without it, and the smoke test below import the checkout instead of the env.
unset PYTHONPATH
PACKER_PYTHON="${PACKER_PYTHON:-$REPO/.venv/bin/python}"
case "$OUTPUT" in /*) ;; *) OUTPUT="$PWD/$OUTPUT" ;; esac

if ! "$PACKER_PYTHON" -c 'import venv_pack' 2>/dev/null; then
    echo "build_env_archive: $PACKER_PYTHON has no venv-pack: run '$PACKER_PYTHON -m pip install venv-pack'" \
         "(or set PACKER_PYTHON to a Python that has it)" >&2
    exit 1
fi
if [ -n "$FROM_VENV" ] && [ ! -x "$FROM_VENV/bin/python" ]; then
    echo "build_env_archive: $FROM_VENV is not a venv (no bin/python); for the BigDL env run 'make bigdl-env' first" >&2
    exit 1
fi

# ---- up to date? ------------------------------------------------------------------------------------------------
inputs() {
    echo "script $(sha256sum "$0" | cut -d' ' -f1)"
    echo "options from_venv=$FROM_VENV python_prefix=$PYTHON_PREFIX extras=$EXTRAS"
    if [ -n "$FROM_VENV" ]; then
        echo "venv $(cd "$FROM_VENV" && ls -l --time-style=+%s lib/python*/site-packages | sha256sum | cut -d' ' -f1)"
    else
        echo "python $("$PYTHON" -c 'import sys; print(sys.version.split()[0], sys.base_prefix)')"
        (cd "$REPO" && sha256sum setup.py constraints.txt README.md)
    fi
    (cd "$REPO" && find pipelines model_export conf \( -name '*.py' -o -name '*.yaml' \) -type f | LC_ALL=C sort \
        | xargs sha256sum)
}
WANT="$(inputs)"
if [ "$FORCE" = 0 ] && [ -f "$OUTPUT" ] && [ -f "$OUTPUT.inputs" ] && [ "$(cat "$OUTPUT.inputs")" = "$WANT" ]; then
    echo "build_env_archive: $OUTPUT is up to date ($(du -h "$OUTPUT" | cut -f1))"
    exit 0
fi

start=$SECONDS
BUILD="$REPO/build/env-archive/$(basename "$OUTPUT" .tar.gz)"
rm -rf "$BUILD"
mkdir -p "$BUILD" "$(dirname "$OUTPUT")"
# The build env is only the archive's source: gone when the script ends, however it ends.
trap 'rm -rf "$BUILD"' EXIT
source "$REPO/scripts/env_lib.sh"   # quiet_pip, env_pip

if [ -z "$FROM_VENV" ]; then
    # ---- a fresh env: the package, then its requirements minus pyspark/py4j, pinned by constraints.txt --------
    PREFIX="$BUILD/venv"
    "$PYTHON" -m venv "$PREFIX"
    # Build from a copy of the sources: an in-tree build would write build/ and *.egg-info into the checkout.
    mkdir -p "$BUILD/src"
    (cd "$REPO" && cp -r setup.py README.md pipelines model_export conf "$BUILD/src/")
    find "$BUILD/src" -name __pycache__ -prune -exec rm -rf {} +
    quiet_pip "$PREFIX" wheel --no-deps --wheel-dir "$BUILD/wheel" "$BUILD/src"
    WHEEL="$(ls "$BUILD"/wheel/sparkseg-*.whl)"
    REQUIREMENTS="$("$PREFIX/bin/python" - "$WHEEL" "$EXTRAS" <<'EOF'
import re, sys, zipfile
from email.parser import Parser

wheel, extras = sys.argv[1], {e.strip() for e in sys.argv[2].split(",") if e.strip()}
with zipfile.ZipFile(wheel) as archive:
    metadata = next(name for name in archive.namelist() if name.endswith(".dist-info/METADATA"))
    requires = Parser().parsestr(archive.read(metadata).decode()).get_all("Requires-Dist") or []
for line in requires:
    spec, _, marker = line.partition(";")
    extra = re.search(r"extra\s*==\s*['\"]([^'\"]+)['\"]", marker)
    name = re.split(r"[<>=!~\[ (]", spec.strip(), maxsplit=1)[0].lower()
    if (extra is None or extra.group(1) in extras) and name not in ("pyspark", "py4j"):
        print(spec.strip())
EOF
)"
    # shellcheck disable=SC2086  (one requirement per line, no spaces inside)
    # No bytecode compiled at install (much of its time: every module of every package); the smoke test below
    # writes it for what executors import.
    env_pip "$PREFIX" --no-compile -c "$REPO/constraints.txt" $(echo "$REQUIREMENTS" | tr '\n' ' ')
    env_pip "$PREFIX" --no-compile --no-deps "$WHEEL"
    "$PREFIX/bin/python" -m pip uninstall --quiet -y pip setuptools 2>/dev/null || true   # not needed on executors
    ADD_PACKAGE=0
else
    PREFIX="$(cd "$FROM_VENV" && pwd)"
    ADD_PACKAGE=1
fi

# Smoke test: what an executor imports (SMOKE_IMPORTS overrides the list), from / (not the checkout's modules).
# A fresh env gets those modules' bytecode written (whatever PYTHONDONTWRITEBYTECODE says here): executors then load
# it instead of compiling it at every Python worker's start wherever the unpacked archive cannot be written. An
# existing venv is not written to: its listing is one of the archive's inputs.
if [ -z "$FROM_VENV" ]; then BYTECODE=(env -u PYTHONDONTWRITEBYTECODE); else BYTECODE=(env PYTHONDONTWRITEBYTECODE=1); fi
# shellcheck disable=SC2086  (a list of module names)
(cd / && "${BYTECODE[@]}" "$PREFIX/bin/python" -W ignore - \
    ${SMOKE_IMPORTS:-numpy openvino pandas pyarrow PIL pycocotools zlib_ng numba pipelines}) <<'EOF'
import importlib, sys

versions = [f"{name} {getattr(importlib.import_module(name), '__version__', '')}".strip() for name in sys.argv[1:]]
print("build_env_archive: imports ok:", ", ".join(versions))
EOF

PARTIAL="$(dirname "$OUTPUT")/.partial-$(basename "$OUTPUT")"   # keeps the extension venv-pack reads
# ---- pack ----------------------------------------------------------------------------------------------------------
"$PACKER_PYTHON" - "$PREFIX" "$PARTIAL" "$PYTHON_PREFIX" "$ADD_PACKAGE" "$REPO" <<'EOF'
import glob, os, sys
import venv_pack

prefix, output, python_prefix, add_package, repo = sys.argv[1:]
env = venv_pack.Env(prefix)
site = os.path.relpath(glob.glob(os.path.join(prefix, "lib", "python3*", "site-packages"))[0], prefix)
# pyspark/py4j come from the cluster's Spark (its pyspark.zip is on the workers' PYTHONPATH)
for pattern in ("pyspark/*", "py4j/*", "pyspark-*.dist-info/*", "py4j-*.dist-info/*"):
    env = env.exclude(os.path.join(site, pattern))
if add_package == "1":
    # an editable sparkseg points at this checkout: replace it by a copy of the package's sources
    for pattern in ("__editable__*sparkseg*", "__pycache__/__editable__*sparkseg*", "sparkseg-*.dist-info/*"):
        env = env.exclude(os.path.join(site, pattern))
    for package in ("pipelines", "model_export"):
        for root, dirs, files in os.walk(os.path.join(repo, package)):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            for name in files:
                if name.endswith(".py"):
                    source = os.path.join(root, name)
                    env.files.append(venv_pack.File(source, os.path.join(site, os.path.relpath(source, repo))))
    for name in sorted(os.listdir(os.path.join(repo, "conf"))):   # installed as pipelines/conf/ (setup.py)
        if name.endswith(".yaml"):
            env.files.append(venv_pack.File(os.path.join(repo, "conf", name),
                                            os.path.join(site, "pipelines", "conf", name)))
env.pack(output=output, python_prefix=python_prefix or None, force=True, verbose=False)
EOF
chmod 644 "$PARTIAL"
mv "$PARTIAL" "$OUTPUT"
echo "$WANT" > "$OUTPUT.inputs"
echo "build_env_archive: wrote $OUTPUT ($(du -h "$OUTPUT" | cut -f1); unpacked $(du -sh "$PREFIX" | cut -f1) before" \
     "exclusions) in $((SECONDS - start)) s"
