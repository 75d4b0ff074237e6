"""A deterministic corpus of awkward image files, for any test that reads images.

    expected = build_bad_input_corpus(tmp_path)   # {file name: "ok" or an ImageDecodeError reason}

Every file is small (a few KB) except the 8000x8000 flat JPEG (~375 KB; it decodes to 192 MB of RGB), which
`include_large=False` leaves out. Patterns with known pixel values are exposed so tests can check content:
`exif_pattern()` (stored pixels of the EXIF-rotated JPEG), CMYK_QUADRANTS, gray16_pattern().
"""

from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path

import numpy as np
from PIL import Image

OK = "ok"
LARGE_NAME = "large_8000x8000.jpg"

# The CMYK JPEG: four 16x16 quadrants (top-left, top-right, bottom-left, bottom-right) as CMYK ink values,
# and the RGB they should become (R = 255 - C, G = 255 - M, B = 255 - Y, all times (255 - K) / 255).
CMYK_QUADRANTS = {
    "cyan": ((255, 0, 0, 0), (0, 255, 255)),
    "magenta": ((0, 255, 0, 0), (255, 0, 255)),
    "yellow": ((0, 0, 255, 0), (255, 255, 0)),
    "black": ((0, 0, 0, 255), (0, 0, 0)),
}
# The palette PNG: index 0 is transparent (its colour is kept, alpha dropped), 1 red, 2 green, 3 blue.
PALETTE_COLORS = ((10, 20, 30), (255, 0, 0), (0, 255, 0), (0, 0, 255))


def build_bad_input_corpus(directory: Path, include_large: bool = True) -> dict[str, str]:
    """Write the corpus into `directory` (created if missing); returns {file name: expected outcome}."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    files: dict[str, tuple[bytes, str]] = {
        "empty.jpg": (b"", "empty"),
        "truncated.jpg": (_truncated_jpeg(), "truncated"),
        "random_bytes.jpg": (_random_bytes(), "not_an_image"),
        "text_named.png": (b"this is a text file, not a PNG\n", "not_an_image"),
        "damaged_header.png": (b"\x89PNG\r\n\x1a\n" + b"\x00" * 24, "corrupt"),
        "bomb_header_30000x30000.png": (png_header_only(30_000, 30_000), "too_large"),
        "over_limit_header_12000x12000.png": (png_header_only(12_000, 12_000), "too_large"),
        "one_pixel.png": (_encode(Image.new("RGB", (1, 1), (200, 100, 50)), "PNG"), OK),
        "cmyk.jpg": (_cmyk_jpeg(), OK),
        "gray16.png": (_encode(Image.fromarray(gray16_pattern()), "PNG"), OK),
        "gray.jpg": (_encode(Image.fromarray(_gradient(48, 32)), "JPEG", quality=90), OK),
        "rgba.png": (_rgba_png(), OK),
        "exif_orientation_6.jpg": (_exif_rotated_jpeg(), OK),
        "palette_transparent.png": (_palette_png(), OK),
        "float32.tif": (_encode(Image.fromarray(_gradient(48, 32).astype(np.float32) / 255.0), "TIFF"), OK),
        "png_named.jpg": (_encode(Image.new("RGB", (8, 8), (0, 128, 255)), "PNG"), OK),
    }
    if include_large:
        files[LARGE_NAME] = (_encode(Image.new("RGB", (8000, 8000), (90, 140, 200)), "JPEG", optimize=True), OK)
    for name, (data, _) in files.items():
        (directory / name).write_bytes(data)
    return {name: outcome for name, (_, outcome) in files.items()}


def exif_pattern() -> np.ndarray:
    """Stored pixels of exif_orientation_6.jpg: uint8 [32, 48, 3] (H, W, 3).

    Left half red, right half blue, top 8 rows green. Orientation 6 means "rotate 90 degrees clockwise to
    display", so the decoded image should be np.rot90(exif_pattern(), k=-1): [48, 32, 3], red on top, blue
    below, the green band on the right (a transpose would put it on the left, a counter-clockwise turn would put
    red at the bottom).
    """
    pattern = np.zeros((32, 48, 3), np.uint8)
    pattern[:, :24] = (255, 0, 0)
    pattern[:, 24:] = (0, 0, 255)
    pattern[:8] = (0, 255, 0)
    return pattern


def gray16_pattern() -> np.ndarray:
    """Pixels of gray16.png: uint16 [16, 32] covering 0..65535 (first 0, last 65535)."""
    return np.linspace(0, 65535, 16 * 32).round().astype(np.uint16).reshape(16, 32)


def png_header_only(width: int, height: int) -> bytes:
    """A PNG whose IHDR declares width x height RGB but which has no pixel data (a decompression-bomb stand-in)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr) + _png_chunk(b"IEND", b"")


def _png_chunk(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))


def _encode(image: Image.Image, image_format: str, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, image_format, **options)
    return buffer.getvalue()


def _gradient(width: int, height: int) -> np.ndarray:
    """uint8 [height, width], rising left to right and top to bottom."""
    y, x = np.mgrid[0:height, 0:width]
    return ((x * 3 + y * 2) % 256).astype(np.uint8)


def _truncated_jpeg() -> bytes:
    noise = np.random.default_rng(1).integers(0, 256, (128, 128, 3), dtype=np.uint8)
    data = _encode(Image.fromarray(noise), "JPEG", quality=90)
    return data[: len(data) // 2]  # header intact, scan data cut in the middle


def _random_bytes() -> bytes:
    data = np.random.default_rng(2).integers(0, 256, 4096, dtype=np.uint8).tobytes()
    return b"\x00" + data[1:]  # no format's magic number starts with a NUL byte


def _cmyk_jpeg() -> bytes:
    """32x32 CMYK JPEG (Pillow writes the Adobe marker and inverted CMYK, as Photoshop does)."""
    image = Image.new("CMYK", (32, 32))
    corners = [(0, 0), (16, 0), (0, 16), (16, 16)]
    for (x, y), (cmyk, _) in zip(corners, CMYK_QUADRANTS.values()):
        image.paste(cmyk, (x, y, x + 16, y + 16))
    return _encode(image, "JPEG", quality=95)


def _rgba_png() -> bytes:
    rgba = np.zeros((16, 24, 4), np.uint8)
    rgba[..., 0] = 200
    rgba[..., 1] = 60
    rgba[..., 2] = 20
    rgba[..., 3] = np.linspace(0, 255, 24).astype(np.uint8)  # alpha ramps left to right
    return _encode(Image.fromarray(rgba), "PNG")


def _exif_rotated_jpeg() -> bytes:
    image = Image.fromarray(exif_pattern())
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: rotate 90 CW to display
    return _encode(image, "JPEG", quality=95, exif=exif.tobytes())


def _palette_png() -> bytes:
    """16x16 palette PNG: four 8x8 quadrants using palette indices 0..3; index 0 is transparent."""
    indices = np.zeros((16, 16), np.uint8)
    indices[:8, 8:] = 1
    indices[8:, :8] = 2
    indices[8:, 8:] = 3
    image = Image.frombytes("P", (16, 16), indices.tobytes())
    image.putpalette([value for color in PALETTE_COLORS for value in color])
    return _encode(image, "PNG", transparency=0)
