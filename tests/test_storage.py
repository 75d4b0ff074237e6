"""pipelines.io.storage: URI helpers, atomic writes and listing on local disk and through fsspec (memory://)."""

from __future__ import annotations

import os
import uuid

import fsspec
import pytest

from pipelines.io import storage, uris
from pipelines.io.storage import exists, list_files, read_bytes, to_spark_uri, write_bytes_atomic
from pipelines.io.uris import is_local, join_uri, to_local_path


@pytest.mark.parametrize(
    "uri, local",
    [
        ("/data/x.jpg", True),
        ("data/x.jpg", True),
        ("file:///data/x.jpg", True),
        ("file:/data/x.jpg", True),
        ("C:\\data\\x.jpg", True),
        ("az://c/x.jpg", False),
        ("abfss://c@a.dfs.core.windows.net/x", False),
        ("hdfs://nn/x", False),
        ("memory://x", False),
    ],
)
def test_is_local(uri, local):
    assert is_local(uri) is local


@pytest.mark.parametrize(
    "uri, path",
    [
        ("/data/x.jpg", "/data/x.jpg"),
        ("rel/x.jpg", "rel/x.jpg"),
        ("file:///data/x.jpg", "/data/x.jpg"),
        ("file:/data/x.jpg", "/data/x.jpg"),
        ("file://localhost/data/x.jpg", "/data/x.jpg"),
        ("file:///data/a b/x?.jpg", "/data/a b/x?.jpg"),  # Hadoop style: no percent-decoding, '?' is a name char
    ],
)
def test_to_local_path(uri, path):
    assert to_local_path(uri) == path


def test_to_local_path_rejects_remote_uris():
    with pytest.raises(ValueError, match="not a local path"):
        to_local_path("az://container/x.jpg")
    with pytest.raises(ValueError, match="names host"):
        to_local_path("file://server/share/x.jpg")


@pytest.mark.parametrize(
    "base, parts, joined",
    [
        ("az://c/out", ("masks", "a.png"), "az://c/out/masks/a.png"),
        ("az://c/out/", ("masks/", "/a.png".lstrip("/")), "az://c/out/masks/a.png"),
        ("az://c", ("a.png",), "az://c/a.png"),
        ("abfss://c@acct.dfs.core.windows.net/run1", ("errors",), "abfss://c@acct.dfs.core.windows.net/run1/errors"),
        ("/tmp/out", ("x", "y.bin"), "/tmp/out/x/y.bin"),
        ("/", ("x",), "/x"),
        ("file:///", ("x",), "file:///x"),
        ("memory://", ("x", "y"), "memory://x/y"),
        ("hdfs://nn:8020/data", ("a//b",), "hdfs://nn:8020/data/a/b"),
        ("/tmp/out", (), "/tmp/out"),
    ],
)
def test_join_uri(base, parts, joined):
    assert join_uri(base, *parts) == joined


def test_join_uri_rejects_escaping_parts():
    with pytest.raises(ValueError, match="absolute"):
        join_uri("az://c/out", "/etc/passwd")
    with pytest.raises(ValueError, match=r"'\.\.'"):
        join_uri("az://c/out", "../other")
    with pytest.raises(ValueError, match="absolute"):
        join_uri("/tmp", "az://c/x")


def test_to_spark_uri(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # Hadoop's spelling (Spark's `path` column): `file:/abs`, never percent-encoded; file: URIs as given.
    assert to_spark_uri("images") == f"file:{tmp_path.resolve()}/images"
    assert to_spark_uri("a b%20c") == f"file:{tmp_path.resolve()}/a b%20c"
    assert to_spark_uri("file:/data/x") == "file:/data/x"
    assert to_spark_uri("s3://bucket/k") == "s3a://bucket/k"
    assert to_spark_uri("hdfs://nn/data") == "hdfs://nn/data"
    assert to_spark_uri("abfss://c@acct.dfs.core.windows.net/p") == "abfss://c@acct.dfs.core.windows.net/p"
    assert to_spark_uri("az://images/2024", account="acct") == "abfss://images@acct.dfs.core.windows.net/2024"

    for name in ("AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_CONNECTION_STRING"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match="AZURE_STORAGE_ACCOUNT_NAME"):
        to_spark_uri("az://images/2024")
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_NAME", "envacct")
    assert to_spark_uri("az://images/2024") == "abfss://images@envacct.dfs.core.windows.net/2024"


def test_local_atomic_write_replaces_and_leaves_no_temp_files(tmp_path):
    target = tmp_path / "a" / "b" / "mask.png"
    write_bytes_atomic(str(target), b"first")
    write_bytes_atomic(f"file://{target}", b"second version")
    assert target.read_bytes() == b"second version"
    assert os.listdir(target.parent) == ["mask.png"]
    umask = os.umask(0)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask  # like open(), not mkstemp's 0600

    assert read_bytes(f"file:{target}") == b"second version"
    assert exists(str(target)) and exists(f"file://{target.parent}") and not exists(str(tmp_path / "nope"))


def test_a_non_durable_local_write_is_as_atomic_without_the_fsyncs(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd))[1])  # counts, then syncs
    target = storage.Location.of(str(tmp_path / "marker"))
    target.write_bytes_atomic(b"in flight: a.jpg")
    assert len(synced) == 2  # the file, then its directory (the rename)
    target.write_bytes_atomic(b"in flight: b.jpg", durable=False)
    assert len(synced) == 2 and target.read_bytes() == b"in flight: b.jpg"
    assert os.listdir(tmp_path) == ["marker"]


def test_failed_local_write_keeps_the_old_state_and_no_temp_file(tmp_path):
    (tmp_path / "taken").mkdir()  # a directory where the file should go: os.replace fails
    with pytest.raises(OSError):
        write_bytes_atomic(str(tmp_path / "taken"), b"data")
    assert os.listdir(tmp_path) == ["taken"] and os.listdir(tmp_path / "taken") == []
    with pytest.raises(TypeError, match="bytes"):
        write_bytes_atomic(str(tmp_path / "x.bin"), "text, not bytes")
    assert os.listdir(tmp_path) == ["taken"]


@pytest.fixture
def image_tree(tmp_path):
    """images/{a.jpg, B.JPG, c.png, notes.txt, .hidden.jpg, sub/d.jpeg, sub/e.Png, _tmp/f.jpg, .cache/g.jpg}"""
    root = tmp_path / "images"
    for name in [
        "a.jpg",
        "B.JPG",
        "c.png",
        "notes.txt",
        ".hidden.jpg",
        "sub/d.jpeg",
        "sub/e.Png",
        "_tmp/f.jpg",
        ".cache/g.jpg",
    ]:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(name.encode())
    return root


def test_list_files_local_recursive_case_insensitive_skips_hidden(image_tree):
    found = list_files(str(image_tree), [".jpg", "png", ".JPEG"])
    assert found == sorted(str(image_tree / name) for name in ["a.jpg", "B.JPG", "c.png", "sub/d.jpeg", "sub/e.Png"])
    everything = list_files(str(image_tree))
    assert str(image_tree / "notes.txt") in everything and len(everything) == 6

    as_uris = list_files(f"file://{image_tree}", ".png")
    assert as_uris == [f"file://{image_tree}/c.png", f"file://{image_tree}/sub/e.Png"]
    assert list_files(str(image_tree / "a.jpg"), ["jpg"]) == [str(image_tree / "a.jpg")]
    assert list_files(str(image_tree / "a.jpg"), ["png"]) == []


def test_list_files_errors_name_the_input(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing"):
        list_files(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="extensions"):
        list_files(str(tmp_path), [])


def test_fsspec_scheme_write_read_list(tmp_path):
    root = f"memory://sparkseg-test-{uuid.uuid4().hex[:8]}"
    try:
        write_bytes_atomic(join_uri(root, "out", "a.jpg"), b"one")
        write_bytes_atomic(join_uri(root, "out", "a.jpg"), b"two")
        write_bytes_atomic(join_uri(root, "out", "deep", "b.PNG"), b"three")
        write_bytes_atomic(join_uri(root, "out", "notes.txt"), b"four")

        assert read_bytes(join_uri(root, "out", "a.jpg")) == b"two"
        assert exists(join_uri(root, "out", "deep")) and not exists(join_uri(root, "out", "nope.jpg"))
        listed = list_files(join_uri(root, "out"), [".jpg", ".png"])
        assert [uri.rsplit("/out/", 1)[1] for uri in listed] == ["a.jpg", "deep/b.PNG"]
        assert all(uri.startswith("memory://") for uri in listed)
        fs = fsspec.filesystem("memory")
        assert not [path for path in fs.find(root) if path.endswith(".tmp")], "temp files left behind"
    finally:
        fsspec.filesystem("memory").rm(root, recursive=True)


def test_remove_temp_files_takes_only_the_named_files_temps(tmp_path):
    for name in ("a.png", ".a.png.k3j_x9a2.tmp", ".a.png.x.png.q1w2e3r4.tmp", ".b.png.z9y8x7w6.tmp", ".a.png.tmp"):
        (tmp_path / name).write_bytes(b"x")
    assert storage.Location(str(tmp_path)).remove_temp_files(["a.png"]) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".a.png.tmp",
        ".a.png.x.png.q1w2e3r4.tmp",
        ".b.png.z9y8x7w6.tmp",
        "a.png",
    ]
    root = f"memory://sparkseg-test-{uuid.uuid4().hex[:8]}"
    try:
        fs = fsspec.filesystem("memory")
        for name in ("a.png", ".a.png.0123abcd.tmp", ".b.png.0123abcd.tmp"):
            fs.pipe_file(f"{root}/{name}", b"x")
        assert storage.Location(root).remove_temp_files({"a.png"}) == 1
        assert sorted(path.rpartition("/")[2] for path in fs.ls(root, detail=False)) == [".b.png.0123abcd.tmp", "a.png"]
    finally:
        fsspec.filesystem("memory").rm(root, recursive=True)


def test_remove_tree_removes_a_directory_and_its_hidden_files_and_nothing_beside(tmp_path):
    for name in ("marks/r1/p0/attempt-1", "marks/r1/p0/.attempt-2.ab12.tmp", "marks/_x", "marks-2/keep"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"x")
    storage.Location(f"file://{tmp_path}/marks").remove_tree()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["marks-2"]
    storage.Location(str(tmp_path / "marks")).remove_tree()  # gone already: nothing to do
    root = f"memory://sparkseg-test-{uuid.uuid4().hex[:8]}"
    fs = fsspec.filesystem("memory")
    try:
        for name in ("marks/r1/p0/attempt-1", "marks/.hidden", "marks-2/keep"):
            fs.pipe_file(f"{root}/{name}", b"x")
        storage.Location(f"{root}/marks").remove_tree()
        assert [path.rpartition("/")[2] for path in fs.find(root)] == ["keep"]
        storage.Location(f"{root}/marks").remove_tree()
    finally:
        fs.rm(root, recursive=True)


def test_normalize_extensions():
    assert uris.normalize_extensions(["JPG", ".Png"]) == (".jpg", ".png")
    assert uris.normalize_extensions(".jpg") == (".jpg",)
    assert uris.normalize_extensions(None) is None


def test_one_routing_rule_for_every_store():
    from pipelines.io.uris import store_of

    routes = {
        "/data/x.jpg": "local",
        "data/x.jpg": "local",
        "file:/a b/x.jpg": "local",
        "file:///d": "local",
        "az://c/p": "azure_sdk",
        "AZ://c/p": "azure_sdk",
        "abfs://c@a.dfs.core.windows.net/p": "azure_sdk",
        "abfss://c@a.dfs.core.windows.net/p": "hadoop",
        "wasbs://c@a.blob.core.windows.net/p": "hadoop",
        "hdfs://nn/data": "hadoop",
        "s3://bucket/k": "hadoop",
        "memory://x": "hadoop",
        "C:/data": "local",
    }
    assert {uri: store_of(uri) for uri in routes} == routes


def test_publish_once_keeps_the_first_file_and_removes_the_later_ones_staging(tmp_path):
    """Two processes building the same content-keyed file (the library zip, a staged model): the first one's file
    stays, byte for byte and with its time stamp, since a SparkContext that added it copies it again by path."""
    target = tmp_path / "sparkseg_pipelines.zip"
    first, second = tmp_path / ".first.tmp", tmp_path / ".second.tmp"
    first.write_bytes(b"first build")
    second.write_bytes(b"second build, other time stamps")
    storage.publish_once(first, target)
    before = target.stat()
    storage.publish_once(second, target)
    assert target.read_bytes() == b"first build" and target.stat().st_mtime_ns == before.st_mtime_ns
    assert not first.exists() and not second.exists()
