"""Output paths: always inside the output root, never two inputs on one output, across URI kinds."""

from __future__ import annotations

import os
import posixpath
import unicodedata
from pathlib import Path
from urllib.parse import unquote_to_bytes

import pytest

from pipelines.io.output_paths import (
    EXTERNAL_DIR,
    MAX_COMPONENT_CHARS,
    encode_component,
    mask_output_path,
    relative_key,
)
from pipelines.spark.session_kind import qualify_root

ROOT = "file:/data/in"
OUT = "abfss://out@acct.dfs.core.windows.net/run1"

ADVERSARIAL_NAMES = [
    "img.jpg",
    "img.png",
    "img.JPG",
    "IMG.jpg",
    "Img.Jpg",
    "a/b/img.jpg",
    "a/b/c/img.jpg",
    "../../etc/passwd",
    "../in/img.jpg",
    "../inx/img.jpg",
    "/abs",
    "//abs2",
    "a/../../b",
    "a/../b",
    "a/./b/c",
    "a//b/c2",
    "./c3",
    "...",
    "..hidden",
    ".hidden",
    "_hidden",
    "_external/x.jpg",
    "C:\\x",
    "C:/x",
    "a\\..\\..\\b",
    "\\\\server\\share",
    "%2e%2e",
    "%2E%2E/x",
    "%2e%2e%2fetc",
    "%",
    "%%",
    "%25",
    "~",
    "x~y",
    "caf\u00e9.jpg",
    "cafe\u0301.jpg",
    "\u212bngstrom",
    "\u00c5ngstrom",
    "\u202egnp.exe",
    "\uff0e\uff0e",
    "\u56fe\u7247.jpg",
    "sp ace.jpg",
    "tab\t.jpg",
    "nl\n.jpg",
    "nul\x00.jpg",
    "del\x7f.jpg",
    "q?.jpg",
    "h#.jpg",
    "colon:.jpg",
    "star*.jpg",
    "dot.",
    "dir./f.jpg",
    "dir../f.jpg",
    "x",
    "x.png/1.jpg",
    "x.PNG/2.jpg",
    "emoji\U0001f600.jpg",
    "lone\udc80surrogate",
    "a" * 300,
    "a" * 299 + "b",
    "\u00e9" * 300,
    "d" * 300 + "/f.jpg",
    "d" * 299 + "e/f.jpg",
]


def _assert_inside(path: str, root: str) -> None:
    prefix = f"{root.rstrip('/')}/masks/"
    assert path.startswith(prefix), path
    key = path[len(prefix) :]
    parts = key.split("/")
    assert all(part not in ("", ".", "..") for part in parts), path
    assert all(0x20 < ord(char) < 0x7F for char in key), f"non-printable or non-ASCII in {path!r}"
    assert all(len(part.encode()) <= 255 for part in parts), path
    assert "\\" not in key and ":" not in key, path
    assert posixpath.normpath("/" + key) == "/" + key, path  # nothing a path normalizer would change


def _decode_key(key: str) -> str:
    return unquote_to_bytes(key).decode("utf-8", "surrogatepass")


def test_examples():
    assert (
        mask_output_path("hdfs://nn:8020/out", "hdfs://nn:8020/in/a/b/img.jpg", "hdfs://nn:8020/in")
        == "hdfs://nn:8020/out/masks/a/b/img.jpg.png"
    )
    assert mask_output_path(OUT + "/", "file:/data/in/img.png", "/data/in/") == OUT + "/masks/img.png.png"
    assert relative_key("file:/data/in/sp ace/caf\u00e9 #1.jpg", ROOT) == "sp%20ace/caf%C3%A9%20%231.jpg"


@pytest.mark.parametrize(
    "input_uri,input_root,expected",
    [
        ("file:/data/in/a/b.jpg", "file:///data/in/", "a/b.jpg"),
        ("file:///data/in/a/b.jpg", "/data/in", "a/b.jpg"),
        ("/data/in/a/b.jpg", "file://localhost/data/in", "a/b.jpg"),
        ("FILE:/data/in/a/b.jpg", "file:/data/in", "a/b.jpg"),
        ("hdfs://nn:8020/data/in/a/b.jpg", "hdfs://nn:8020/data/in", "a/b.jpg"),
        ("hdfs://NN:8020/data/in/a/b.jpg", "HDFS://nn:8020/data/in/", "a/b.jpg"),
        ("abfss://c@a.dfs.core.windows.net/x/y.jpg", "abfss://c@a.dfs.core.windows.net/", "x/y.jpg"),
        ("abfss://c@a.dfs.core.windows.net/x/y.jpg", "abfss://c@a.dfs.core.windows.net", "x/y.jpg"),
        ("az://c/x/y.jpg", "az://c/", "x/y.jpg"),
        ("dbfs:/mnt/in/y.jpg", "dbfs:///mnt/in", "y.jpg"),
        ("samples/images/cat.jpg", "samples/images", "cat.jpg"),
        ("/data/in/a/../b/./c.jpg", "/data/in", "b/c.jpg"),
    ],
)
def test_roots_in_any_form_are_stripped(input_uri, input_root, expected):
    assert relative_key(input_uri, input_root) == expected


@pytest.mark.parametrize(
    "input_uri,input_root",
    [
        ("hdfs://nn:8020/data/in/a.jpg", "hdfs://other:8020/data/in"),  # other authority
        ("hdfs://nn:8020/data/in/a.jpg", "hdfs:///data/in"),  # unqualified root: qualify_root it first
        ("hdfs://nn:8020/data/in/a.jpg", "/data/in"),  # other scheme, same path
        ("abfss://c@a.dfs.core.windows.net/x/y.jpg", "abfss://d@a.dfs.core.windows.net/"),  # other container
        ("/data/inx/a.jpg", "/data/in"),  # prefix of a name, not a directory
        ("/data/in", "/data/in"),  # the root itself
        ("/data/in/../../etc/passwd", "/data/in"),
        ("C:\\data\\in\\a.jpg", "/data/in"),
        ("samples/images/cat.jpg", "/work/samples/images"),  # relative input, absolute root
    ],
)
def test_inputs_outside_the_root_go_to_external(input_uri, input_root):
    key = relative_key(input_uri, input_root)
    top, digest, name = key.split("/")
    assert top == EXTERNAL_DIR and len(digest) == 24 and name
    _assert_inside(mask_output_path(OUT, input_uri, input_root), OUT)


def test_adversarial_names_stay_inside_and_never_collide():
    inputs = [f"{ROOT}/{name}" for name in ADVERSARIAL_NAMES]
    inputs += ["/abs", "file:/etc/passwd", "hdfs://nn/data/in/img.jpg", "C:\\x", "file:/data/in/"]
    outputs = {}
    for uri in inputs:
        path = mask_output_path(OUT, uri, ROOT)
        _assert_inside(path, OUT)
        outputs.setdefault(path, set()).add(uri)

    # Same output <=> same file: identity by scheme and posixpath.normpath, independent of the code under test.
    def identity(uri: str) -> str:
        scheme, _, rest = uri.partition(":") if uri.startswith(("file:", "hdfs:")) else ("file", "", uri)
        return scheme + ":" + posixpath.normpath(rest if rest.startswith("/") else "/" + rest)

    for path, uris in outputs.items():
        assert len({identity(uri) for uri in uris}) == 1, f"{sorted(uris)} collide on {path}"
    assert len(outputs) == len({identity(uri) for uri in inputs})


def test_unicode_forms_and_case_stay_distinct():
    nfc, nfd = unicodedata.normalize("NFC", "caf\u00e9"), unicodedata.normalize("NFD", "caf\u00e9")
    assert nfc != nfd
    keys = {relative_key(f"{ROOT}/{name}.jpg", ROOT) for name in (nfc, nfd, "CAF\u00c9", "Caf\u00e9")}
    assert len(keys) == 4


def test_keys_decode_back_to_the_names():
    for name in ADVERSARIAL_NAMES:
        key = relative_key(f"{ROOT}/{name}", ROOT)
        if key.startswith(EXTERNAL_DIR) or "~" in key:
            continue
        expected = posixpath.relpath(posixpath.normpath("/data/in/" + name), "/data/in")
        assert _decode_key(key) == expected, name


def test_percent_is_encoded_so_encoded_looking_names_stay_literal():
    assert relative_key(f"{ROOT}/%2e%2e/x", ROOT) == "%252e%252e/x"
    assert relative_key(f"{ROOT}/%41.jpg", ROOT) != relative_key(f"{ROOT}/A.jpg", ROOT)


def test_hidden_and_reserved_prefixes_are_encoded():
    assert relative_key(f"{ROOT}/.hidden/x.jpg", ROOT) == "%2Ehidden/x.jpg"
    assert relative_key(f"{ROOT}/_external/x.jpg", ROOT) == "%5Fexternal/x.jpg"
    assert relative_key(f"{ROOT}/dot./x.jpg", ROOT) == "dot%2E/x.jpg"


def test_directory_named_like_a_mask_file_does_not_clash_with_it():
    as_file = mask_output_path(OUT, f"{ROOT}/x", ROOT)  # .../masks/x.png
    in_dir = mask_output_path(OUT, f"{ROOT}/x.png/1.jpg", ROOT)  # .../masks/x%2Epng/1.jpg.png
    assert not in_dir.startswith(as_file + "/")
    assert in_dir == f"{OUT}/masks/x%2Epng/1.jpg.png"


def test_long_names_are_truncated_with_a_hash_and_stay_distinct():
    long_a = relative_key(f"{ROOT}/{'a' * 300}", ROOT)
    long_b = relative_key(f"{ROOT}/{'a' * 299}b", ROOT)
    assert long_a != long_b and len(long_a) == len(long_b) == MAX_COMPONENT_CHARS
    assert long_a.startswith("a" * 150) and "~" in long_a
    # A literal name equal to a truncated key cannot collide: its "~" is encoded.
    assert relative_key(f"{ROOT}/{long_a}", ROOT) != long_a
    multibyte = encode_component("\u00e9" * 300)
    assert len(multibyte) <= MAX_COMPONENT_CHARS and "%C3%A9~" in multibyte  # cut between characters


def test_output_root_must_be_given():
    with pytest.raises(ValueError, match="output_root"):
        mask_output_path("", f"{ROOT}/a.jpg", ROOT)


def test_on_a_real_file_system_every_input_gets_its_own_file_inside_the_root(tmp_path):
    """Files with hostile but legal Linux names; write one output per input and count what lands where."""
    input_root, output_root = tmp_path / "in", tmp_path / "out"
    names = [
        "img.jpg",
        "img.png",
        "IMG.jpg",
        "caf\u00e9.jpg",
        "cafe\u0301.jpg",
        "%2e%2e",
        "...",
        ".hidden",
        "_external",
        "C:\\x",
        "tab\t.jpg",
        "nl\n.jpg",
        "sp ace",
        "x",
        "x.png/1.jpg",
        "deep/er/f.jpg",
        "a" * 250,
        "a" * 249 + "b",
        "\u00e9" * 120,
        "~",
        "\u202eevil",
    ]
    for name in names:
        (input_root / name).parent.mkdir(parents=True, exist_ok=True)
        (input_root / name).write_bytes(name.encode("utf-8"))
    inputs = [f"file:{Path(dirpath) / file}" for dirpath, _, files in os.walk(input_root) for file in files]
    assert len(inputs) == len(names)
    for uri in inputs:
        destination = Path(mask_output_path(str(output_root), uri, f"file://{input_root}/"))
        destination.parent.mkdir(parents=True, exist_ok=True)
        with open(destination, "xb") as out:  # "x": fails if another input already wrote here
            out.write(uri.encode("utf-8", "surrogatepass"))
    written = [Path(dirpath) / file for dirpath, _, files in os.walk(output_root) for file in files]
    assert len(written) == len(inputs)
    for path in written:
        assert path.resolve().is_relative_to((output_root / "masks").resolve())
        assert EXTERNAL_DIR not in path.parts


def test_spark_listed_paths_under_a_qualified_root(spark, tmp_path):
    input_root = tmp_path / "images"
    names = ["sp ace.jpg", "caf\u00e9.jpg", "pct%2e.jpg", "sub dir/q#1?.jpg"]
    for name in names:
        (input_root / name).parent.mkdir(parents=True, exist_ok=True)
        (input_root / name).write_bytes(b"x")
    root = qualify_root(spark, f"{input_root}/")
    assert root == f"file:{input_root}"
    relative = qualify_root(spark, "some/relative/dir")  # against the driver JVM's working directory
    assert relative.startswith("file:/") and relative.endswith("/some/relative/dir")
    listed = [
        row.path
        for row in spark.read.format("binaryFile")
        .option("recursiveFileLookup", "true")
        .load(str(input_root))
        .select("path")
        .collect()
    ]
    keys = sorted(relative_key(uri, root) for uri in listed)
    assert keys == sorted(["sp%20ace.jpg", "caf%C3%A9.jpg", "pct%252e.jpg", "sub%20dir/q%231%3F.jpg"])
