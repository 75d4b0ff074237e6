"""Where an input image's outputs go: safe, collision-free keys derived from its path under the input root.

    relative_key("abfss://c@acct.dfs.core.windows.net/in/a/b/img.jpg", "abfss://c@acct.dfs.core.windows.net/in")
        -> "a/b/img.jpg"
    mask_output_path("hdfs://nn:8020/out", input_uri, input_root) -> "hdfs://nn:8020/out/masks/a/b/img.jpg.png"

The key keeps the directory structure and the full file name (img.jpg and img.png never collide). Guarantees:
- Inside the root: every key is a relative path of non-empty components without "/", ".", ".." or control
  characters, so `output_root/masks/<key>.png` is always under `output_root/masks/`.
- Injective: distinct input files give distinct keys. Each component is percent-encoded: ASCII letters, digits,
  "-", "_" and "." are kept, everything else (including "%", "~", space, "\\", ":", NUL and all non-ASCII,
  as UTF-8 bytes) becomes %XX. A leading "." or "_", a trailing ".", and the "." of a directory name ending in
  ".png" are encoded too (hidden files for Spark/Hadoop; Windows/Azure trailing dots; a directory "x.png" would
  clash with the mask file of an input "x"). Decoding %XX gives the name back, so the mapping is reversible.
  Unicode is NOT normalized: NFC "é" and NFD "e\u0301" are different files on Linux, HDFS, ADLS and S3, and
  get different keys. Case is kept: names differing only by case stay distinct on case-sensitive stores
  (HDFS, ADLS, S3, Linux); on a case-insensitive output file system (macOS, Windows) they would clash.
- Length: an encoded component longer than MAX_COMPONENT_CHARS is cut and suffixed "~" + 16 hex digits of
  its SHA-256 ("~" never appears otherwise, as a literal "~" is encoded).
- Input paths are normalized lexically ("a/./b", "a//b", "a/x/../b" are a/b); an input that is not under the
  root after that (different scheme or authority, "../" escaping it, a Windows path like "C:\\x") gets the key
  `_external/<24 hex digits of SHA-256 of its normalized URI>/<encoded file name>`. Internal keys never start
  with "_external" (a leading "_" is encoded).

URIs: scheme://authority/path (hdfs://nn:8020/, abfss://c@a.dfs.core.windows.net/, az://c/, s3a://b/), scheme:/path
(file:/, dbfs:/), or a plain path. "file:/x", "file:///x", "file://localhost/x" and "/x" are the same place.
Paths are taken literally, as Spark's binaryFile `path` column gives them (not percent-decoded). The root must
have the same scheme and authority as the inputs: qualify it first (pipelines.spark.session_kind.qualify_root:
hdfs:///data -> hdfs://nn:8020/data, samples/images -> file:/home/me/sparkseg/samples/images when run from
/home/me/sparkseg).
"""

from __future__ import annotations

import hashlib
import json
import re
import string
from dataclasses import dataclass

MASKS_DIR = "masks"
EXTERNAL_DIR = "_external"
MAX_COMPONENT_CHARS = 200  # + ".png" stays under the common 255-byte file name limit (HDFS, ext4, ADLS)
TRUNCATION_HASH_CHARS = 16
EXTERNAL_HASH_CHARS = 24

_SAFE_CHARS = frozenset(string.ascii_letters + string.digits + "-_.")
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]+):(.*)$", re.DOTALL)  # 2+ letters: "C:" is a drive, not a scheme


@dataclass(frozen=True)
class Location:
    """A parsed, lexically normalized input or root path."""

    scheme: str  # lower case; "file" for absolute local paths, "" for relative paths
    authority: str  # lower case; "" if none
    absolute: bool
    parts: tuple[str, ...]  # path components: none empty, ".", or ".." (a relative path may start with "..")

    def canonical(self) -> str:
        return json.dumps([self.scheme, self.authority, self.absolute, list(self.parts)], ensure_ascii=False)


def parse_location(uri: str) -> Location:
    """Split a URI or path into scheme, authority and normalized components."""
    match = _SCHEME.match(uri)
    if match:
        scheme, rest = match.group(1).lower(), match.group(2)
        if rest.startswith("//"):
            authority, _, path = rest[2:].partition("/")
            path = "/" + path
        else:
            authority, path = "", rest
        authority = authority.lower()
        if scheme == "file" and authority == "localhost":
            authority = ""
    else:
        scheme, authority, path = ("file" if uri.startswith("/") else ""), "", uri
    absolute = path.startswith("/")
    return Location(scheme, authority, absolute, _normalize_parts(path.split("/"), absolute))


def relative_key(input_uri: str, input_root: str) -> str:
    """The input's safe, collision-free key (a relative POSIX path) for naming its outputs."""
    location, root = parse_location(input_uri), parse_location(input_root)
    relative = _relative_parts(location, root)
    if relative is None:
        return _external_key(location)
    last = len(relative) - 1
    return "/".join(encode_component(part, is_directory=index < last) for index, part in enumerate(relative))


def mask_output_path(output_root: str, input_uri: str, input_root: str) -> str:
    """`<output_root>/masks/<relative_key>.png`: where the input's label-map PNG goes."""
    if not output_root:
        raise ValueError("output_root is empty: give the directory or URI where outputs should go")
    return f"{output_root.rstrip('/')}/{MASKS_DIR}/{relative_key(input_uri, input_root)}.png"


def frame_mask_output_path(output_root: str, video_uri: str, input_root: str, frame_index: int) -> str:
    """`<output_root>/masks/<relative_key>/<frame_index:06d>.png`: where a video frame's label-map PNG goes."""
    if not output_root:
        raise ValueError("output_root is empty: give the directory or URI where outputs should go")
    return f"{output_root.rstrip('/')}/{MASKS_DIR}/{relative_key(video_uri, input_root)}/{int(frame_index):06d}.png"


def encode_component(name: str, is_directory: bool = False) -> str:
    """One path component -> its safe, reversible, length-limited form (see the module docstring)."""
    encoded = [char if char in _SAFE_CHARS else _percent(char) for char in name]
    if not encoded:
        raise ValueError("a path component cannot be empty")
    if name[0] in "._":
        encoded[0] = _percent(name[0])
    if name[-1] == ".":
        encoded[-1] = _percent(".")
    if is_directory and name.lower().endswith(".png"):
        encoded[-4] = _percent(".")
    return _limit_length(encoded)


def _normalize_parts(components: list[str], absolute: bool) -> tuple[str, ...]:
    parts: list[str] = []
    for component in components:
        if component in ("", "."):
            continue
        if component == "..":
            if parts and parts[-1] != "..":
                parts.pop()
            elif not absolute:
                parts.append("..")  # a relative path going above its start; "/.." is "/"
            continue
        parts.append(component)
    return tuple(parts)


def _relative_parts(location: Location, root: Location) -> tuple[str, ...] | None:
    """location's components below root, or None if it is not strictly inside root."""
    same_place = (location.scheme, location.authority, location.absolute) == (
        root.scheme,
        root.authority,
        root.absolute,
    )
    if not same_place or location.parts[: len(root.parts)] != root.parts:
        return None
    relative = location.parts[len(root.parts) :]
    if not relative or ".." in relative:
        return None
    return relative


def _external_key(location: Location) -> str:
    digest = hashlib.sha256(location.canonical().encode("utf-8", "surrogatepass")).hexdigest()
    name = location.parts[-1] if location.parts and location.parts[-1] != ".." else "input"
    return f"{EXTERNAL_DIR}/{digest[:EXTERNAL_HASH_CHARS]}/{encode_component(name)}"


def _percent(char: str) -> str:
    return "".join(f"%{byte:02X}" for byte in char.encode("utf-8", "surrogatepass"))


def _limit_length(encoded: list[str]) -> str:
    """Join per-character encodings; if too long, cut at a character boundary and add "~" + hash."""
    joined = "".join(encoded)
    if len(joined) <= MAX_COMPONENT_CHARS:
        return joined
    digest = hashlib.sha256(joined.encode("ascii")).hexdigest()[:TRUNCATION_HASH_CHARS]
    budget, kept = MAX_COMPONENT_CHARS - 1 - TRUNCATION_HASH_CHARS, []
    for piece in encoded:
        if budget < len(piece):
            break
        kept.append(piece)
        budget -= len(piece)
    return "".join(kept) + "~" + digest
