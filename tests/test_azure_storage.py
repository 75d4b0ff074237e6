"""pipelines.io.azure_storage against Azurite: credentials from the environment only, listing, reads, atomic writes,
and secrets that never show in repr/str, exception messages, tracebacks or logs."""

from __future__ import annotations

import datetime as dt
import io
import logging
import pickle
import traceback

import pytest
from PIL import Image

from pipelines.io import storage
from pipelines.io.azure_credentials import AzureCredentials, BlobPath, parse_blob_uri
from pipelines.io.azure_storage import (
    AzureBlobStore,
    blob_exists,
    list_blobs,
    read_blob,
    write_blob,
)
from tests.fixtures_azurite import ACCOUNT_KEY

AZURE_ENV = [
    "AZURE_STORAGE_CONNECTION_STRING",
    "AZURE_STORAGE_ACCOUNT_NAME",
    "AZURE_STORAGE_ACCOUNT_KEY",
    "AZURE_STORAGE_SAS_TOKEN",
    "AZURE_STORAGE_BLOB_ENDPOINT",
    "AZURE_CLIENT_ID",
    "AZURE_CLIENT_SECRET",
    "AZURE_TENANT_ID",
]
# A valid-looking key that Azurite does not accept (base64 of 64 bytes).
WRONG_KEY = "d3Jvbmcta2V5LXdyb25nLWtleS13cm9uZy1rZXktd3Jvbmcta2V5LXdyb25nLWtleS13cm9uZy1rZXktd3Jvbmc="


@pytest.fixture
def clean_env(monkeypatch):
    """No Azure variables from the machine: each test sets exactly the ones it means."""
    for name in AZURE_ENV:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.fixture
def container(azurite):
    return azurite.create_container()


def _image_bytes(fmt: str, color: tuple[int, int, int]) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 6), color).save(buffer, format=fmt)
    return buffer.getvalue()


def _assert_no_secret(text: str, *secrets: str) -> None:
    for secret in secrets:
        assert secret not in text, "a secret leaked"


# ---- URIs ----


@pytest.mark.parametrize(
    "uri, expected",
    [
        ("az://images/2024/a.jpg", BlobPath("az", "images", "2024/a.jpg")),
        ("az://images", BlobPath("az", "images", "")),
        (
            "abfss://images@acct.dfs.core.windows.net/2024/",
            BlobPath("abfss", "images", "2024/", "acct", "acct.dfs.core.windows.net"),
        ),
        (
            "wasbs://images@acct.blob.core.windows.net/a.jpg",
            BlobPath("wasbs", "images", "a.jpg", "acct", "acct.blob.core.windows.net"),
        ),
        ("abfs://images/2024/a.jpg", BlobPath("abfs", "images", "2024/a.jpg")),  # adlfs spelling
    ],
)
def test_parse_blob_uri(uri, expected):
    assert parse_blob_uri(uri) == expected
    assert parse_blob_uri(uri).uri == uri


@pytest.mark.parametrize(
    "uri, message",
    [
        ("s3://bucket/x", "not an Azure URI"),
        ("az:///x", "names no container"),
        ("az://c/x?sig=abc", "SAS"),
        ("abfss://c@/x", "after '@'"),
    ],
)
def test_parse_blob_uri_rejects(uri, message):
    with pytest.raises(ValueError, match=message):
        parse_blob_uri(uri)


# ---- credentials ----


def test_credentials_from_env_in_order_and_never_printed(clean_env):
    clean_env.setenv("AZURE_CLIENT_ID", "app-id")
    clean_env.setenv("AZURE_CLIENT_SECRET", "sp-secret-value")
    clean_env.setenv("AZURE_TENANT_ID", "tenant-id")
    service_principal = AzureCredentials.from_env()
    assert service_principal.kind == "service_principal"

    clean_env.setenv("AZURE_STORAGE_ACCOUNT_NAME", "acct")
    clean_env.setenv("AZURE_STORAGE_SAS_TOKEN", "?sv=2024-01-01&sig=sas%2Bsignature%3D")
    sas = AzureCredentials.from_env()
    assert sas.kind == "sas" and sas.sas_token.startswith("sv=")

    clean_env.setenv("AZURE_STORAGE_ACCOUNT_KEY", ACCOUNT_KEY + "\n")  # trailing newline from a secret file
    key = AzureCredentials.from_env()
    assert key.kind == "account_key" and key.account_key == ACCOUNT_KEY and key.account_name == "acct"

    connection_string = f"DefaultEndpointsProtocol=https;AccountName=csacct;AccountKey={ACCOUNT_KEY};"
    clean_env.setenv("AZURE_STORAGE_CONNECTION_STRING", connection_string)
    clean_env.delenv("AZURE_STORAGE_ACCOUNT_NAME")
    from_cs = AzureCredentials.from_env()
    assert from_cs.kind == "connection_string" and from_cs.account_name == "csacct"

    secrets = [ACCOUNT_KEY, connection_string, "sp-secret-value", "sas%2Bsignature%3D", "sas+signature="]
    for creds in (service_principal, sas, key, from_cs):
        for text in (repr(creds), str(creds), f"{creds}", repr([creds]), repr(AzureBlobStore(creds))):
            _assert_no_secret(text, *secrets)
            assert "***" in text
        restored = pickle.loads(pickle.dumps(creds))
        assert restored == creds and restored.kind == creds.kind
        _assert_no_secret(repr(restored), *secrets)
    assert pickle.loads(pickle.dumps(AzureBlobStore(key))).credentials == key


def test_credentials_missing_or_incomplete_name_the_variables(clean_env):
    with pytest.raises(ValueError, match="AZURE_STORAGE_CONNECTION_STRING.*AZURE_STORAGE_ACCOUNT_NAME"):
        AzureCredentials.from_env()
    clean_env.setenv("AZURE_STORAGE_ACCOUNT_KEY", ACCOUNT_KEY)
    with pytest.raises(ValueError, match="AZURE_STORAGE_ACCOUNT_NAME") as failure:
        AzureCredentials.from_env()
    _assert_no_secret(str(failure.value), ACCOUNT_KEY)
    clean_env.delenv("AZURE_STORAGE_ACCOUNT_KEY")
    clean_env.setenv("AZURE_CLIENT_ID", "app-id")
    with pytest.raises(ValueError, match="AZURE_CLIENT_SECRET, AZURE_TENANT_ID missing"):
        AzureCredentials.from_env()


class DatabricksSecretsStandIn:
    """Databricks' `dbutils` cannot run here: the same `dbutils.secrets.get(scope=, key=)` over a dict."""

    def __init__(self, scopes: dict[str, dict[str, str]]):
        self.secrets = self
        self._scopes = scopes

    def get(self, scope: str, key: str) -> str:
        try:
            return self._scopes[scope][key]
        except KeyError:
            raise RuntimeError(f"Secret does not exist with scope: {scope} and key: {key}") from None


def test_credentials_from_databricks_secret_scope():
    dbutils = DatabricksSecretsStandIn(
        {
            "storage": {
                "acct-key": ACCOUNT_KEY,
                "acct-name": "acct",
                "sp-id": "app",
                "sp-secret": "sp-secret-value",
                "tenant": "t",
            }
        }
    )
    key = AzureCredentials.from_databricks_secrets(
        dbutils, "storage", account_key_key="acct-key", account_name_key="acct-name"
    )
    assert key.kind == "account_key" and key.account_name == "acct" and key.account_key == ACCOUNT_KEY
    _assert_no_secret(repr(key), ACCOUNT_KEY)

    sp = AzureCredentials.from_databricks_secrets(
        dbutils,
        "storage",
        client_id_key="sp-id",
        client_secret_key="sp-secret",
        tenant_id_key="tenant",
        account_name="acct",
    )
    assert sp.kind == "service_principal" and sp.account_name == "acct"

    with pytest.raises(ValueError, match="'missing-key' from Databricks scope 'storage'"):
        AzureCredentials.from_databricks_secrets(dbutils, "storage", account_key_key="missing-key")
    with pytest.raises(ValueError, match="name at least one secret"):
        AzureCredentials.from_databricks_secrets(dbutils, "storage")


def test_scrub_replaces_plain_and_url_encoded_secrets(clean_env):
    clean_env.setenv("AZURE_STORAGE_ACCOUNT_NAME", "acct")
    clean_env.setenv("AZURE_STORAGE_ACCOUNT_KEY", ACCOUNT_KEY)
    creds = AzureCredentials.from_env()
    from urllib.parse import quote

    text = f"key={ACCOUNT_KEY} url=https://x/?k={quote(ACCOUNT_KEY, safe='')}"
    assert creds.scrub(text) == "key=*** url=https://x/?k=***"


def test_sdk_error_text_with_a_secret_is_reraised_scrubbed(clean_env):
    from azure.core.exceptions import HttpResponseError

    connection_string = f"DefaultEndpointsProtocol=https;AccountName=acct;AccountKey={ACCOUNT_KEY};"
    clean_env.setenv("AZURE_STORAGE_CONNECTION_STRING", connection_string)
    store = AzureBlobStore()

    def sdk_call_that_echoes_the_secret():
        raise HttpResponseError(message=f"bad request for connection string {connection_string}")

    with pytest.raises(OSError) as failure:
        store._call("read", "az://c/a.jpg", sdk_call_that_echoes_the_secret)
    error = failure.value
    assert "az://c/a.jpg" in str(error) and "***" in str(error)
    assert error.__context__ is None and error.__cause__ is None
    _assert_no_secret(
        str(error) + repr(error) + "".join(traceback.format_exception(error)), ACCOUNT_KEY, connection_string
    )


# ---- against Azurite ----


def test_upload_list_read_write_with_connection_string_from_env(azurite, container, clean_env):
    clean_env.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite.connection_string)
    images = {
        "2024/a.jpg": _image_bytes("JPEG", (255, 0, 0)),
        "2024/B.JPG": _image_bytes("JPEG", (0, 255, 0)),
        "2024/deep/c.png": _image_bytes("PNG", (0, 0, 255)),
        "2024/notes.txt": b"not an image",
        "2025/d.jpg": _image_bytes("JPEG", (9, 9, 9)),
        "20240/e.jpg": b"prefix look-alike",
    }
    for name, data in images.items():
        write_blob(f"az://{container}/{name}", data)

    listed = list_blobs(f"az://{container}/2024", [".jpg", "PNG"])
    assert [info.uri for info in listed] == [
        f"az://{container}/2024/{name}" for name in ["B.JPG", "a.jpg", "deep/c.png"]
    ]
    assert [info.size for info in listed] == [len(images["2024/" + name]) for name in ["B.JPG", "a.jpg", "deep/c.png"]]
    assert all(isinstance(info.mtime, dt.datetime) and info.mtime.tzinfo is not None for info in listed)
    assert len(list_blobs(f"az://{container}")) == len(images)
    assert list_blobs(f"az://{container}/2024/a.jpg", ["jpg"])[0].uri == f"az://{container}/2024/a.jpg"

    for info in listed:
        data = read_blob(info.uri)
        assert data == images[info.uri.split("/", 3)[3]]
        Image.open(io.BytesIO(data)).verify()

    # The Hadoop spelling of the same blobs.
    abfss = f"abfss://{container}@{azurite.account_name}.dfs.core.windows.net/2024"
    assert [info.uri.rsplit("/2024/", 1)[1] for info in list_blobs(abfss, ".jpg")] == ["B.JPG", "a.jpg"]
    assert read_blob(abfss + "/a.jpg") == images["2024/a.jpg"]

    # Overwrite: readers see the new bytes; storage.* route az:// here too.
    storage.write_bytes_atomic(f"az://{container}/2024/a.jpg", b"replaced")
    assert storage.read_bytes(f"az://{container}/2024/a.jpg") == b"replaced"
    assert storage.list_files(f"az://{container}/2025", ["jpg"]) == [f"az://{container}/2025/d.jpg"]
    assert blob_exists(f"az://{container}/2024") and blob_exists(f"az://{container}/2024/a.jpg")
    assert not blob_exists(f"az://{container}/202") and not blob_exists(f"az://{container}/2024/zzz.jpg")
    assert not storage.exists("az://no-such-container/x.jpg")


def test_account_key_and_sas_credentials(azurite, container, clean_env):
    from azure.storage.blob import ContainerSasPermissions, generate_container_sas

    write_blob(f"az://{container}/x/a.jpg", b"bytes", AzureCredentials(connection_string=azurite.connection_string))
    clean_env.setenv("AZURE_STORAGE_ACCOUNT_NAME", azurite.account_name)
    clean_env.setenv("AZURE_STORAGE_BLOB_ENDPOINT", azurite.blob_endpoint)
    clean_env.setenv("AZURE_STORAGE_ACCOUNT_KEY", azurite.account_key)
    assert read_blob(f"az://{container}/x/a.jpg") == b"bytes"

    clean_env.delenv("AZURE_STORAGE_ACCOUNT_KEY")
    sas = generate_container_sas(
        azurite.account_name,
        container,
        account_key=azurite.account_key,
        permission=ContainerSasPermissions(read=True, write=True, list=True),
        expiry=dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=1),
    )
    clean_env.setenv("AZURE_STORAGE_SAS_TOKEN", sas)
    creds = AzureCredentials.from_env()
    assert creds.kind == "sas"
    with AzureBlobStore(creds) as store:  # one store, many calls (the executor pattern)
        store.write(f"az://{container}/x/b.png", b"png bytes")
        assert [info.uri for info in store.list(f"az://{container}/x", ".PNG")] == [f"az://{container}/x/b.png"]
        assert store.read(f"az://{container}/x/a.jpg") == b"bytes"


def test_errors_name_the_uri_and_carry_no_secret(azurite, container, clean_env, caplog):
    caplog.set_level(logging.DEBUG)
    good = AzureCredentials(connection_string=azurite.connection_string)
    with pytest.raises(FileNotFoundError, match=f"az://{container}/missing.jpg"):
        read_blob(f"az://{container}/missing.jpg", good)
    with pytest.raises(ValueError, match="names a container or directory"):
        write_blob(f"az://{container}/dir/", b"x", good)

    wrong_connection_string = azurite.connection_string.replace(azurite.account_key, WRONG_KEY)
    clean_env.setenv("AZURE_STORAGE_CONNECTION_STRING", wrong_connection_string)
    with pytest.raises(PermissionError) as failure:
        write_blob(f"az://{container}/a.jpg", b"x")
    error = failure.value
    assert f"az://{container}/a.jpg" in str(error) and "AuthorizationFailure" in str(error)
    assert error.__context__ is None and error.__cause__ is None  # the SDK error (request, headers) is dropped
    texts = str(error) + repr(error) + "".join(traceback.format_exception(error)) + caplog.text
    _assert_no_secret(texts, WRONG_KEY, wrong_connection_string, azurite.account_key)

    # A wrong SAS signature: the signed request URL must not surface either.
    clean_env.delenv("AZURE_STORAGE_CONNECTION_STRING")
    clean_env.setenv("AZURE_STORAGE_ACCOUNT_NAME", azurite.account_name)
    clean_env.setenv("AZURE_STORAGE_BLOB_ENDPOINT", azurite.blob_endpoint)
    bad_sig = "Zm9yZ2VkLXNpZ25hdHVyZS1mb3JnZWQtc2lnbmF0dXJl"
    clean_env.setenv("AZURE_STORAGE_SAS_TOKEN", f"sv=2024-08-04&sr=c&sp=rl&se=2099-01-01T00%3A00%3A00Z&sig={bad_sig}")
    with pytest.raises(PermissionError) as failure:
        list_blobs(f"az://{container}")
    texts = str(failure.value) + repr(failure.value) + "".join(traceback.format_exception(failure.value)) + caplog.text
    _assert_no_secret(texts, bad_sig)


def test_credentials_travel_to_spark_executors(spark, azurite, container):
    creds = AzureCredentials(connection_string=azurite.connection_string)
    uris = [f"az://{container}/img-{index}.png" for index in range(4)]
    for index, uri in enumerate(uris):
        write_blob(uri, _image_bytes("PNG", (index, index, index)), creds)

    listed = [info.uri for info in list_blobs(f"az://{container}", [".png"], creds)]
    sizes = (
        spark.sparkContext.parallelize(listed, 2)
        .map(lambda uri: (uri, Image.open(io.BytesIO(read_blob(uri, creds))).size))
        .collect()
    )
    assert sorted(sizes) == [(uri, (8, 6)) for uri in uris]


def test_an_azure_input_is_listed_by_the_executors(spark, azurite, container):
    """The job's listing of an az:// input (image_sources.find_images, reader azure_sdk) has the same blobs as
    list_blobs for a directory, a directory URI with its slash, a whole container and a blob's own URI (a blob
    that is also a directory), with blobs at the top, nested directories, a look-alike prefix and other
    extensions around; it comes from the executors (the plan holds no rows made on the driver); a path with
    nothing under it is an InputError. Names starting with '.' or '_' under the input are hidden, as on every
    store; a blob `2024//x.jpg` (a virtual directory of the empty name) is listed once, not its whole parent again."""
    from pipelines.inference.image_sources import InputError, find_images

    creds = AzureCredentials(connection_string=azurite.connection_string)
    names = [
        "top.jpg",
        "2024/a.jpg",
        "2024/a.jpg/inside.png",
        "2024/B.JPG",
        "2024/deep/c.png",
        "2024/deep/er/d.jpg",
        "2024/day1/e.jpg",
        "2024/notes.txt",
        "20240/f.jpg",
        "2024/only/dir/g.txt",
        "2024//slash.jpg",
        "2024/_tmp/h.jpg",
        "2024/.dot.jpg",
        "2024/_hidden.jpg",
        "_top.jpg",
    ]
    for length, name in enumerate(names, start=1):
        write_blob(f"az://{container}/{name}", b"x" * length, creds)
    extensions = [".jpg", ".png"]
    for uri in (
        f"az://{container}/2024",
        f"az://{container}/2024/",
        f"az://{container}",
        f"az://{container}/2024/a.jpg",
    ):
        found = find_images(spark, uri, extensions, reader="azure_sdk", azure_credentials=creds)
        listed = sorted((row.path, row.size) for row in found.scanned.collect())
        assert listed == [(info.uri, info.size) for info in list_blobs(uri, extensions, creds)], uri
        assert len(set(listed)) == len(listed) and not any("_" in path or "/." in path for path, _ in listed), uri
        plan = found.scanned._jdf.queryExecution().optimizedPlan().toString()
        assert "LocalRelation" not in plan and "LogicalRDD" in plan
    assert (
        len(
            find_images(
                spark, f"az://{container}", extensions, reader="azure_sdk", azure_credentials=creds
            ).scanned.collect()
        )
        == 9
    )
    with pytest.raises(InputError, match="does not exist"):
        find_images(spark, f"az://{container}/2025", extensions, reader="azure_sdk", azure_credentials=creds)


def test_remove_tree_deletes_every_blob_under_the_prefix_hidden_ones_too(azurite, container, clean_env):
    clean_env.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite.connection_string)
    for name in (
        "out/_marks/r1-w00000/p00000/attempt-000000000007",
        "out/_marks/r1-w00001/p00003/.x.tmp",
        "out/_marks",
        "out/_marks2/keep",
        "out/detections/part-0.parquet",
    ):
        write_blob(f"az://{container}/{name}", b"x")
    storage.Location(f"az://{container}/out/_marks").remove_tree()
    client = azurite.service_client().get_container_client(container)
    assert sorted(blob.name for blob in client.list_blobs()) == ["out/_marks2/keep", "out/detections/part-0.parquet"]
    storage.Location(f"az://{container}/out/_marks").remove_tree()  # gone already: nothing to do
