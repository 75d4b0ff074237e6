"""What only a Spark Connect session needs beyond the DataFrame API (session_kind.ConnectSession delegates here):
ending a dead client's session, and checking before any work that the server's Python workers can run the job.

The Connect client's own modules (grpc) are imported where they are used: a classic env need not have them, and a
Connect session exists only where they are installed.
"""

from __future__ import annotations

import copy
import logging
import re
from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql import SparkSession

from pipelines.errors import UsageError

log = logging.getLogger(__name__)

# The line of a worker's error that names what it lacks (Python's import errors), else its first line.
_IMPORT_ERROR = re.compile(r"^\s*((?:ModuleNotFoundError|ImportError|PySparkImportError)\b.*)$", re.MULTILINE)


def end_session(spark: SparkSession, session_id: str) -> int:
    """Interrupt the operations of another client's session on `spark`'s server and release it: a killed client's
    wave keeps running on the server and would commit rows that the run taking over its output does again. Returns
    the number of operations interrupted; 0 for a session the server no longer has (ended, or another server's)."""
    from pyspark.sql.connect.client import SparkConnectClient

    builder = copy.copy(spark.client._builder)  # type: ignore[attr-defined]  # this endpoint and credentials
    builder._params = {**builder._params, "session_id": session_id}
    try:
        client = SparkConnectClient(connection=builder)
    except Exception as error:  # noqa: BLE001  (best effort: the lock is ours either way)
        log.warning("could not reach the Spark Connect session %s of the run before: %s", session_id, error)
        return 0
    interrupted: list[str] = []
    try:
        interrupted = client.interrupt_all() or []
        client.release_session()
    except Exception as error:  # noqa: BLE001  (a session the server has not: nothing runs there)
        log.info("Spark Connect session %s of the run before: %s", session_id, error)
    finally:
        client.close()
    if interrupted:
        log.warning(
            "interrupted %d operation(s) of the run before (Spark Connect session %s): its client is gone",
            len(interrupted),
            session_id,
        )
    return len(interrupted)


def check_workers(spark: SparkSession, modules: tuple[str, ...]) -> None:
    """A UsageError before any work when the server's Python workers cannot import `modules` (the server's own
    Python, which the client does not choose): one task imports them. The library must be shipped first."""

    def probe(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import importlib

        for module in modules:
            importlib.import_module(module)
        yield from batches

    try:
        spark.range(1).mapInArrow(probe, "id long").collect()
    except Exception as error:  # noqa: BLE001  (whatever the workers raised: reported as one line)
        text = str(error)
        found = _IMPORT_ERROR.search(text)
        reason = found.group(1).strip() if found else text.strip().splitlines()[0]
        endpoint = getattr(spark.client._builder, "endpoint", "the Spark Connect server")  # type: ignore[attr-defined]
        raise UsageError(
            f"{endpoint}: the server's Python workers cannot run the job's executor code ({reason}): install "
            "sparkseg's inference requirements (pip install -c constraints.txt .) in the Python the server's "
            "executors run (its PYSPARK_PYTHON, or the cluster's environment)"
        ) from None
