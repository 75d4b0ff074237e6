"""Azure Blob / ADLS Gen2 through the Azure SDK, for clusters without the hadoop-azure jar.

Executors list (`listing_top`, then `listing_part` of each directory), read (`read_blob`) and write (`write_blob`);
`list_blobs` lists on the calling process. The credentials (`AzureCredentials`, pipelines.io.azure_credentials)
travel to executors inside the task closure; every SDK error is re-raised as an OSError whose message has the
secrets replaced by `***` (the original exception, whose attributes may hold signed URLs, is dropped).

URIs (parsed by pipelines.io.azure_credentials.parse_blob_uri): `az://container/path` (account from the credentials), `abfs[s]://container@account.dfs.core.windows.net/path`,
`wasb[s]://container@account.blob.core.windows.net/path`, and adlfs' `abfs://container/path`.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import enum
import functools
import logging
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, NamedTuple, TypeVar

from pipelines.errors import StorageError, UsageError
from pipelines.io.azure_credentials import (
    ENV_ACCOUNT_NAME,
    AzureCredentials,
    BlobPath,
    parse_blob_uri,
    redact_sas_in_http_logs,
)
from pipelines.io.uris import has_extension, is_hidden, normalize_extensions

if TYPE_CHECKING:
    from azure.storage.blob import BlobServiceClient

log = logging.getLogger(__name__)
T = TypeVar("T")


class AzureStorageError(StorageError):
    """An Azure Storage call failed: one line naming the URI (exit 1, as for every store)."""


class BlobNotFound(AzureStorageError, FileNotFoundError):
    """No such blob or container (still a FileNotFoundError for the callers that test for one)."""


class BlobAccessDenied(AzureStorageError, PermissionError):
    """The credentials were refused (401/403)."""


# ---- blob I/O ---------------------------------------------------------------------------------------------------


class BlobInfo(NamedTuple):
    uri: str
    size: int  # bytes
    mtime: dt.datetime  # last modified, UTC


class AzureBlobStore:
    """Blob I/O with one set of credentials. SDK clients are made lazily, one per account, and not pickled:
    ship the store (or the credentials) to executors and create clients there.
    """

    def __init__(self, credentials: AzureCredentials | None = None):
        self.credentials = credentials if credentials is not None else AzureCredentials.from_env()
        self._clients: dict[str, BlobServiceClient] = {}

    def __getstate__(self):
        return {"credentials": self.credentials}

    def __setstate__(self, state):
        self.__init__(state["credentials"])

    def __enter__(self) -> AzureBlobStore:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()

    def __repr__(self) -> str:
        return f"AzureBlobStore({self.credentials!r})"

    def list(self, uri: str, extensions: Iterable[str] | str | None = None) -> list[BlobInfo]:
        """Blobs under `uri` (recursive; `uri` itself when it names a blob and does not end in '/'), sorted by URI,
        filtered by extension (case-insensitive). ADLS directory markers are skipped."""
        return sorted(self.iter_list(uri, extensions))

    def iter_list(self, uri: str, extensions: Iterable[str] | str | None = None) -> Iterator[BlobInfo]:
        """`list`, streamed page by page in the service's order (nothing held: for an executor's share of a
        listing of millions)."""
        path = parse_blob_uri(uri)
        wanted = normalize_extensions(extensions)
        prefix, itself = _directory_name(path.path), not path.path.endswith("/")
        log.debug("listing %s (extensions=%s) with %r", uri, wanted, self.credentials)
        blobs = self._each(
            "list",
            uri,
            lambda: self.container_client(path).list_blobs(name_starts_with=prefix or None, include=["metadata"]),
        )
        for blob in blobs:
            if itself and blob.name == prefix:
                yield from _wanted(path, blob, wanted)
            elif not prefix or blob.name.startswith(prefix + "/"):  # "images" must not match "images2/..."
                if not is_hidden(_below(prefix, blob.name)):
                    yield from _wanted(path, blob, wanted)

    def walk_top(self, uri: str, extensions: Iterable[str] | str | None = None) -> Iterator[BlobInfo | str]:
        """The top level of `list(uri)`, streamed: `uri` itself when `list` includes it and the blobs directly
        under it (BlobInfo), and the URIs of its virtual directories (str, ending in '/'). `list` of each directory
        completes the listing: the directories can be listed in parallel."""
        from azure.storage.blob import BlobPrefix

        path = parse_blob_uri(uri)
        wanted = normalize_extensions(extensions)
        prefix = _directory_name(path.path)
        container = self.container_client(path)
        if prefix and not path.path.endswith("/"):

            def properties():
                from azure.core.exceptions import ResourceNotFoundError

                try:
                    return container.get_blob_client(prefix).get_blob_properties()
                except ResourceNotFoundError:
                    return None

            itself = self._call("list", uri, properties)
            if itself is not None:
                yield from _wanted(path, itself, wanted)
        entries = self._each(
            "list",
            uri,
            lambda: container.walk_blobs(
                name_starts_with=prefix + "/" if prefix else None, include=["metadata"], delimiter="/"
            ),
        )
        for entry in entries:
            if is_hidden(_below(prefix, entry.name)):  # `_tmp/`, `.cache/`, `_x.jpg`
                continue
            if isinstance(entry, BlobPrefix):  # a virtual directory (its name ends in '/')
                yield path.uri_for(entry.name)
            else:
                yield from _wanted(path, entry, wanted)

    def read(self, uri: str) -> bytes:
        """The whole blob."""
        path = _blob_path(uri)
        return self._call("read", uri, lambda: self.container_client(path).download_blob(path.path).readall())

    def write(self, uri: str, data: bytes) -> None:
        """Upload `data` as blob `uri`, replacing it. Atomic: readers see the old or the new blob, never a part
        (small blobs are one Put Blob; large ones are staged blocks made visible by one Put Block List)."""
        path = _blob_path(uri)
        self._call(
            "write", uri, lambda: self.container_client(path).upload_blob(path.path, bytes(data), overwrite=True)
        )

    def exists(self, uri: str) -> bool:
        """True for an existing blob, a prefix with blobs under it, or (for a bare container URI) the container."""
        path = parse_blob_uri(uri)
        prefix = path.path.rstrip("/")

        def check() -> bool:
            container = self.container_client(path)
            if not prefix:
                return container.exists()
            if container.get_blob_client(prefix).exists():
                return True
            if not container.exists():
                return False
            return next(iter(container.list_blobs(name_starts_with=prefix + "/", results_per_page=1)), None) is not None

        return self._call("check", uri, check)

    def remove_tree(self, uri: str) -> None:
        """Delete `uri` as a directory: every blob under it, hidden names and ADLS directory markers included, the
        deepest first (a hierarchical namespace refuses to delete a directory that is not empty)."""
        path = parse_blob_uri(uri)
        prefix = path.path.rstrip("/")
        if not prefix:
            raise ValueError(f"remove_tree({uri!r}): a whole container is never removed")
        container = self.container_client(path)
        names = [
            blob.name
            for blob in self._each("list", uri, lambda: container.list_blobs(name_starts_with=prefix))
            if blob.name == prefix or blob.name.startswith(prefix + "/")
        ]
        for name in sorted(names, reverse=True):
            with contextlib.suppress(FileNotFoundError):  # removed in between
                self._call("delete", path.uri_for(name), functools.partial(container.delete_blob, name))

    def container_client(self, path: BlobPath):
        """The SDK's ContainerClient for `path`'s container (for conditional blob operations, e.g. the run lock)."""
        return self._service(path).get_container_client(path.container)

    # ---- internals ----

    def _service(self, path: BlobPath):
        from azure.storage.blob import BlobServiceClient

        creds = self.credentials
        if creds.connection_string:
            if path.account and creds.account_name and path.account != creds.account_name:
                raise UsageError(
                    f"{path.uri!r} is in account {path.account!r} but the connection string is for "
                    f"{creds.account_name!r}; use matching credentials or an az:// URI"
                )
            cache_key = "connection_string"
            make = lambda: BlobServiceClient.from_connection_string(creds.connection_string)  # noqa: E731
        else:
            account = path.account or creds.account_name
            if not account:
                raise UsageError(
                    f"{path.uri!r} names no storage account; set {ENV_ACCOUNT_NAME} (from a "
                    "Databricks secret scope: the credentials' account_name, the notebook's "
                    f"account_name widget) or use abfss://{path.container}@<account>.dfs.core.windows.net/"
                    f"{path.path}"
                )
            if creds.kind in ("account_key", "sas") and account != creds.account_name:
                raise UsageError(
                    f"{path.uri!r} is in account {account!r} but the {creds.kind} is for "
                    f"{creds.account_name!r}; use matching credentials"
                )
            if creds.blob_endpoint and account == creds.account_name:
                url = creds.blob_endpoint
            elif path.host and ".dfs." in path.host:
                url = "https://" + path.host.replace(".dfs.", ".blob.", 1)
            else:
                url = f"https://{path.host or account + '.blob.core.windows.net'}"
            cache_key = url
            make = lambda: BlobServiceClient(account_url=url, credential=self._sdk_credential(account))  # noqa: E731
        if cache_key not in self._clients:
            redact_sas_in_http_logs()
            self._clients[cache_key] = make()
        return self._clients[cache_key]

    def _sdk_credential(self, account: str):
        creds = self.credentials
        if creds.kind == "account_key":
            return {"account_name": account, "account_key": creds.account_key}
        if creds.kind == "sas":
            return creds.sas_token
        from azure.identity import ClientSecretCredential

        # __post_init__ let a service principal through only with all three set
        assert creds.tenant_id and creds.client_id and creds.client_secret
        return ClientSecretCredential(
            tenant_id=creds.tenant_id, client_id=creds.client_id, client_secret=creds.client_secret
        )

    def _each(self, action: str, uri: str, items: Callable[[], Iterable[T]]) -> Iterator[T]:
        """The items of an SDK iterable (pages fetched as it is read), each failure translated as in `_call`."""
        iterator = self._call(action, uri, lambda: iter(items()))
        while (item := self._call(action, uri, lambda: next(iterator, _End.END))) is not _End.END:
            yield item

    def _call(self, action: str, uri: str, operation: Callable[[], T]) -> T:
        """Run `operation`; turn any failure into an OSError/ValueError with a scrubbed message, chained to nothing."""
        try:
            return operation()
        except Exception as exc:  # noqa: BLE001 - every SDK error must be scrubbed
            error = translate_error(exc, action, uri, self.credentials)
        # Raised outside the except block: the original (and its request URLs, headers) is not kept as __context__.
        raise error


class _End(enum.Enum):
    """The end of an iterator (next()'s default): a type of its own, so that the items keep theirs."""

    END = enum.auto()


def _directory_name(blob_path: str) -> str:
    """The blob-name prefix a listing of `blob_path` covers: without the one '/' that marks a directory (`p/` ->
    `p`; `p//` -> `p/`, the virtual directory of the empty name that a blob `p//c.jpg` makes, not `p` again)."""
    return blob_path[:-1] if blob_path.endswith("/") else blob_path


def _below(prefix: str, name: str) -> str:
    """A listed blob's (or virtual directory's) name relative to the listing's prefix (see _directory_name), whose
    components decide whether it is hidden."""
    return name[len(prefix) + 1 :] if prefix else name


def _wanted(path: BlobPath, blob, wanted) -> Iterator[BlobInfo]:
    """The listed blob as a BlobInfo when it is one of the wanted (by extension, case-insensitive; ADLS directory
    markers never)."""
    if (blob.metadata or {}).get("hdi_isfolder") != "true" and has_extension(blob.name, wanted):
        yield BlobInfo(path.uri_for(blob.name), int(blob.size), blob.last_modified)


def _blob_path(uri: str) -> BlobPath:
    path = parse_blob_uri(uri)
    if not path.path or path.path.endswith("/"):
        raise UsageError(f"{uri!r} names a container or directory, not a blob; add the blob name")
    return path


def translate_error(exc: Exception, action: str, uri: str, creds: AzureCredentials) -> Exception:
    from azure.core.exceptions import ClientAuthenticationError, HttpResponseError, ResourceNotFoundError

    detail = str(exc).split("\nContent:", 1)[0].strip()  # drop the XML body the service appends
    detail = " | ".join(line.strip() for line in detail.splitlines() if line.strip())
    message = creds.scrub(f"cannot {action} {uri}: {type(exc).__name__}: {detail}")
    if isinstance(exc, ResourceNotFoundError):
        return BlobNotFound(message)
    if isinstance(exc, ClientAuthenticationError) or (
        isinstance(exc, HttpResponseError) and getattr(exc, "status_code", None) in (401, 403)
    ):
        return BlobAccessDenied(message + f" (check the credentials: {creds!r})")
    if isinstance(exc, (ValueError, TypeError)):
        return UsageError(message)
    return AzureStorageError(message)


# ---- module-level shortcuts (one store per call) -----------------------------------------------------------------


def list_blobs(
    uri: str, extensions: Iterable[str] | str | None = None, creds: AzureCredentials | None = None
) -> list[BlobInfo]:
    """Driver side: (uri, size, mtime) of every blob under `uri`, recursive, extension filter case-insensitive."""
    with AzureBlobStore(creds) as store:
        return store.list(uri, extensions)


def listing_top(
    uri: str, extensions: Iterable[str] | str | None = None, creds: AzureCredentials | None = None
) -> Iterator[BlobInfo | str]:
    """Executor side, one task: `AzureBlobStore.walk_top` of `uri`, streamed."""
    with AzureBlobStore(creds) as store:
        yield from store.walk_top(uri, extensions)


def listing_part(
    entry: BlobInfo | str, extensions: Iterable[str] | str | None = None, creds: AzureCredentials | None = None
) -> Iterator[BlobInfo]:
    """Executor side: an entry of `listing_top` as blobs: a blob as itself, a virtual directory as every blob under
    it, streamed."""
    if isinstance(entry, BlobInfo):
        yield entry
        return
    with AzureBlobStore(creds) as store:
        yield from store.iter_list(entry, extensions)


def read_blob(uri: str, creds: AzureCredentials | None = None) -> bytes:
    """Executor side: the bytes of one blob. For many blobs per task, reuse one AzureBlobStore."""
    with AzureBlobStore(creds) as store:
        return store.read(uri)


def write_blob(uri: str, data: bytes, creds: AzureCredentials | None = None) -> None:
    """Upload `data` to `uri`, overwriting; atomic."""
    with AzureBlobStore(creds) as store:
        store.write(uri, data)


def blob_exists(uri: str, creds: AzureCredentials | None = None) -> bool:
    with AzureBlobStore(creds) as store:
        return store.exists(uri)
