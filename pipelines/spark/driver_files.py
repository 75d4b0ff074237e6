"""The driver's file operations on one URI that the run lock, the indexes and the summary use for stores the
project's own storage layer (pipelines.io.storage) does not reach: Hadoop URIs through the JVM's FileSystem on a
classic session, local (or mounted) paths in Python on a Connect client, which has no JVM (session_kind picks)."""

from __future__ import annotations

import os
import shutil

from pipelines.io.uris import to_local_path


class HadoopFiles:
    """Driver-side operations on one URI through the JVM's Hadoop FileSystem (the lock, indexes, summary)."""

    def __init__(self, context, uri: str) -> None:
        self.jvm = context._jvm
        self.hadoop_path = self.path(uri)
        self.file_system = self.hadoop_path.getFileSystem(context._jsc.hadoopConfiguration())

    def path(self, uri: str):
        return self.jvm.org.apache.hadoop.fs.Path(uri)

    def qualified(self) -> str:
        return self.file_system.makeQualified(self.hadoop_path).toString()

    def exists(self) -> bool:
        return bool(self.file_system.exists(self.hadoop_path))

    def delete(self) -> bool:
        return bool(self.file_system.delete(self.hadoop_path, True))

    def read_all(self, stream) -> bytes:
        return bytes(self.jvm.org.apache.commons.io.IOUtils.toByteArray(stream))


class LocalFiles:
    """HadoopFiles' operations on a local (or mounted) path, in Python: a Connect client's driver-side file access."""

    def __init__(self, uri: str) -> None:
        self.local = os.path.abspath(to_local_path(uri))

    def qualified(self) -> str:
        return "file:" + self.local  # Hadoop's spelling of a local path (file:/a/b)

    def exists(self) -> bool:
        return os.path.exists(self.local)

    def delete(self) -> bool:
        if not os.path.lexists(self.local):
            return False
        if os.path.isdir(self.local) and not os.path.islink(self.local):
            shutil.rmtree(self.local)
        else:
            os.remove(self.local)
        return True
