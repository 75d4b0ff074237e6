"""BigDL's native libraries (Intel MKL, OpenCV) unpacked once into the BigDL env, for the JVMs to load from there.

BigDL 2.4 loads MKL and OpenCV in every JVM (driver and executors) at `Engine.init`: first from `java.library.path`
(`System.loadLibrary`), and when they are not there, by extracting ~50 MB from its jar into a fresh directory under
/tmp and loading those copies. A copy cut short (a full or failing disk under /tmp) crashes the JVM with SIGBUS in the
dynamic loader (seen once in CI: `ld-linux-x86-64.so.2` memset), and some clusters mount /tmp noexec. With the
libraries unpacked here at `make bigdl-env` (sizes checked against the jar) and this directory on the JVMs' library
path (bigdl_engine: `spark.driver.extraLibraryPath`, `spark.executor.extraLibraryPath`, `--driver-library-path`),
nothing is extracted at run time. A JVM that does not find the directory (an executor with the env elsewhere) falls
back to BigDL's own extraction.

    python -m pipelines.engines.bigdl_natives      # run by scripts/make_bigdl_env.sh inside the BigDL env
"""

from __future__ import annotations

import glob
import os
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

# Jar entry -> the names the JVM and the dynamic loader look for: System.loadLibrary("opencv_core") wants
# libopencv_core.so; the libraries that need it ask for its SONAME, libopencv_core.so.4.2.
NATIVE_LIBRARIES = {
    "libiomp5.so": (),
    "libjmkl.so": (),
    "libopencv_core.so.4.2.0": ("libopencv_core.so", "libopencv_core.so.4.2"),
    "libopencv_imgproc.so.4.2.0": ("libopencv_imgproc.so", "libopencv_imgproc.so.4.2"),
    "libopencv_imgcodecs.so.4.2.0": ("libopencv_imgcodecs.so", "libopencv_imgcodecs.so.4.2"),
    "libopencv_java420.so": (),
}


def native_library_dir() -> Path:
    """Where this interpreter's env keeps the unpacked libraries."""
    return Path(sys.prefix) / "lib" / "bigdl-native"


def installed_native_library_dir() -> str | None:
    """This env's unpacked libraries, when all of them are there (else None: BigDL extracts them itself)."""
    directory = native_library_dir()
    if all((directory / name).is_file() for name in NATIVE_LIBRARIES):
        return str(directory)
    return None


def bigdl_core_jar() -> Path:
    """BigDL core's jar (the one with the native libraries) in this env."""
    import bigdl.share.core.lib as core_lib

    jars = sorted(glob.glob(os.path.join(os.path.dirname(core_lib.__file__), "all-*.jar")))
    if not jars:
        raise FileNotFoundError(
            f"no BigDL core jar (all-*.jar) in {os.path.dirname(core_lib.__file__)}: "
            "rebuild the env with `make bigdl-env`"
        )
    return Path(jars[-1])


def unpack_native_libraries(jar: Path, target: Path) -> Path:
    """Unpack NATIVE_LIBRARIES from `jar` into `target` (replaced whole, by a rename, once every file is complete)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".bigdl-native-", dir=target.parent))
    try:
        with zipfile.ZipFile(jar) as archive:
            for name, aliases in NATIVE_LIBRARIES.items():
                entry = archive.getinfo(name)
                with archive.open(entry) as source, open(staging / name, "wb") as sink:
                    shutil.copyfileobj(source, sink, 1 << 20)
                    sink.flush()
                    os.fsync(sink.fileno())
                size = (staging / name).stat().st_size
                if size != entry.file_size:
                    raise OSError(f"{staging / name}: {size} bytes written of {entry.file_size} (disk full?)")
                for alias in aliases:
                    (staging / alias).symlink_to(name)
        os.chmod(staging, 0o755)
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


if __name__ == "__main__":
    done = unpack_native_libraries(bigdl_core_jar(), native_library_dir())
    print(f"bigdl_natives: {len(NATIVE_LIBRARIES)} native libraries in {done}")
