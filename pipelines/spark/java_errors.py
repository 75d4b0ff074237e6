"""Java exceptions that reach Python through py4j, read as what they mean to a user."""

from __future__ import annotations

from pipelines.errors import StorageError


def unreachable_storage(spark, uri: str, err: Exception) -> StorageError | None:
    """The error to raise when `err`, from a driver-side call on `uri`'s Hadoop FileSystem, is or wraps a Java
    IOException (a file system that cannot be reached, a host that does not resolve, a permission refused), else
    None (a bug, raised as it is). The message names the URI and the Java reason without its stack trace."""
    # Py4JJavaError carries the Java throwable as java_exception; PySpark's converted exceptions (e.g. an
    # IllegalArgumentException wrapping the UnknownHostException of a host that does not resolve) as _origin
    throwable = getattr(err, "java_exception", None) or getattr(err, "_origin", None)
    if throwable is None:
        return None
    io_exception = spark.sparkContext._jvm.java.lang.Class.forName("java.io.IOException")
    while throwable is not None and not io_exception.isInstance(throwable):
        throwable = throwable.getCause()
    if throwable is None:
        return None
    reason = str(throwable.toString()).split(";")[0]  # Hadoop appends "; For more details see: <wiki URL>"
    return StorageError(
        f"{uri}: cannot reach its file system ({reason}): check the URI's host and port, that this "
        "cluster reaches that file system, and its permissions"
    )
