"""Decoding image bytes from storage into uint8 RGB arrays, with clear errors for bad files.

Policy (one place, so every stage sees the same pixels):
- EXIF orientation is applied (the array is what a photo viewer shows).
- Alpha is dropped, not composited: RGBA -> RGB keeps the colour channels as stored. This is what
  `cv2.imread(path, cv2.IMREAD_COLOR)` does, which the reference YOLACT uses, so the model sees the same pixels.
- Palette images are expanded through their palette; grayscale is repeated to three channels.
- CMYK (including Adobe-style inverted CMYK JPEGs, which Pillow's JPEG reader un-inverts) uses Pillow's conversion.
- 16-bit grayscale ("I;16*", and "I" as older Pillow opens 16-bit PNGs) keeps the top byte (value >> 8): full
  range is kept, nothing is clipped. "I" values outside 0..65535 are clamped to it first.
- Float ("F", e.g. float32 TIFF): NaN/inf -> 0; values within [0, 1] are scaled by 255, values within [0, 255]
  are rounded, any other range is stretched min..max to 0..255.
- Multi-frame files (GIF, multi-page TIFF, APNG) give their first frame.
- Truncated files are an error (Pillow's LOAD_TRUNCATED_IMAGES is left alone).
- Decompression bombs: width*height is checked against `max_pixels` from the header, before any pixel data is
  decoded. Pillow's own global limit (Image.MAX_IMAGE_PIXELS, about 89.5 M; DecompressionBombError at twice that)
  also applies inside Image.open: its error becomes "too_large"; its warning is silenced because our own limit
  has already been checked. A `max_pixels` above ~179 M therefore cannot raise the effective limit.
  (warnings.catch_warnings is process-wide: a thread decoding at the same moment may see that filter too.)
- Memory: peak is Pillow's decoded image (4 bytes/pixel for RGB) plus the result (3 bytes/pixel), measured
  468 MB for an 8000x8000 JPEG whose result is 183 MB.
"""

from __future__ import annotations

import io
import sys
import threading
import warnings
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image, ImageFile, UnidentifiedImageError

from pipelines.errors import UsageError

if TYPE_CHECKING:
    from PIL._imaging import ImagingCore

DEFAULT_MAX_PIXELS = 100_000_000
_BAND_PIXELS = 1 << 22  # pixels per band when converting to the output array

# Error reasons (short, machine-readable; they end up in the errors table).
EMPTY = "empty"
NOT_AN_IMAGE = "not_an_image"
TRUNCATED = "truncated"
CORRUPT = "corrupt"
TOO_LARGE = "too_large"
UNSUPPORTED_MODE = "unsupported_mode"
NAME_NOT_UTF8 = "name_not_utf8"  # a listed file whose name has bytes that are not UTF-8: no path reads it
REASONS = (EMPTY, NOT_AN_IMAGE, TRUNCATED, CORRUPT, TOO_LARGE, UNSUPPORTED_MODE, NAME_NOT_UTF8)

# Leading bytes of common formats: tells "damaged image" from "not an image at all" when Pillow gives up.
_MAGIC = (
    (b"\xff\xd8\xff", "JPEG"),
    (b"\x89PNG\r\n\x1a\n", "PNG"),
    (b"GIF87a", "GIF"),
    (b"GIF89a", "GIF"),
    (b"II*\x00", "TIFF"),
    (b"MM\x00*", "TIFF"),
    (b"BM", "BMP"),
)


class ImageDecodeError(UsageError):
    """An input that cannot become an RGB image. `reason` is one of REASONS; the message names the input."""

    def __init__(self, name: str, reason: str, detail: str, advice: str):
        self.name = name
        self.reason = reason
        self.detail = detail
        self.advice = advice
        super().__init__(f"{name}: {detail}: {advice}")

    def __reduce__(self):  # picklable (Spark workers, multiprocessing) despite the 4-argument constructor
        return (type(self), (self.name, self.reason, self.detail, self.advice))


def reuse_decode_memory(blocks: int = 2) -> None:
    """Let Pillow keep `blocks` freed 16 MiB memory blocks in this process (its default keeps none), so that
    decoding image after image reuses them instead of mapping fresh pages and faulting them in, for at most 32 MiB
    held. Executors call it once."""
    Image.core.set_blocks_max(max(Image.core.get_blocks_max(), int(blocks)))


def decode_image(
    data: bytes, name: str, max_pixels: int = DEFAULT_MAX_PIXELS, *, shared_memory: bool = False
) -> np.ndarray:
    """Decode encoded image bytes (JPEG, PNG, TIFF, ...) into an RGB array.

    data: the file's bytes; name: the input's path or URI (used in error messages only).
    Returns uint8 [H, W, 3], EXIF orientation applied. Raises ImageDecodeError.
    shared_memory: where Pillow can decode into memory it shares, return that instead of a copy: read-only uint8
    [H, W, 4], RGB plus one padding byte per pixel (Pillow's storage). For callers that resample and then drop
    the fourth channel (the executors' preprocess): no copy of the image, and 4-byte pixels gather faster.
    RGB images up to REUSED_BUFFER_BYTES are decoded into a buffer this thread reuses once nothing refers to the
    last array returned from it (no zero-filled allocation per image, which Pillow's own allocator makes);
    others share Pillow's memory.
    """
    with _open(data, name) as image:
        _check_pixel_count(image.size, name, max_pixels)
        target = _decode_into_reused_buffer(image) if shared_memory else None
        _load_pixels(image, name)
        shown = _exif_transposed(image)
        if target is not None and shown.im is target[1]:  # decoded there (and not rotated since)
            return target[0]
        pixels = _shared_rgbx(shown) if shared_memory else None
        return pixels if pixels is not None else _to_rgb_array(shown, name)


def decode_image_reduced(
    data: bytes, name: str, min_size: tuple[int, int], max_pixels: int = DEFAULT_MAX_PIXELS
) -> tuple[np.ndarray, tuple[int, int]]:
    """Decode only as much as a network input of ``min_size`` (width, height) needs: a JPEG is decoded at the
    smallest DCT scale (1/2, 1/4 or 1/8, libjpeg's reduced-size decode) whose result still has both sides >= the
    larger side of ``min_size``; other formats are decoded fully.

    Returns (uint8 [h, w, 3] RGB, EXIF orientation applied, possibly reduced; (width, height) of the full-size
    image after EXIF orientation, from the header). The pixels are not those of `decode_image` resized: libjpeg
    scales in the DCT domain (an area average), so a model fed from them gives slightly different detections.
    """
    with _open(data, name) as image:
        _check_pixel_count(image.size, name, max_pixels)
        width, height = image.size
        if _exif_orientation(image) in (5, 6, 7, 8):  # transposed by _exif_transposed below
            width, height = height, width
        if image.format == "JPEG":
            side = max(int(min_size[0]), int(min_size[1]))
            image.draft("RGB", (side, side))
        _load_pixels(image, name)
        return _to_rgb_array(_exif_transposed(image), name), (width, height)


def _exif_orientation(image: Image.Image) -> int:
    try:
        return int(image.getexif().get(0x0112, 1))
    except Exception:  # noqa: BLE001 - unreadable EXIF: as stored
        return 1


def image_size(data: bytes, name: str = "<bytes>") -> tuple[int, int]:
    """(width, height) from the header only; no pixel data is decoded. Raises ImageDecodeError."""
    with _open(data, name) as image:
        return image.size


def _open(data: bytes, name: str) -> ImageFile.ImageFile:
    """Image.open reads the header only; maps its failures to ImageDecodeError."""
    if not data:
        raise ImageDecodeError(name, EMPTY, "file is empty (0 bytes)", "re-upload it or remove it from the input")
    try:
        with warnings.catch_warnings():
            # Our own max_pixels check (right after opening) decides; Pillow's errors above 2x its limit stay.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            return Image.open(io.BytesIO(data))
    except Image.DecompressionBombError as error:
        raise ImageDecodeError(
            name,
            TOO_LARGE,
            f"image is too large to decode safely ({error})",
            "downscale it before processing or remove it",
        ) from error
    except UnidentifiedImageError as error:
        kind = _looks_like(data)
        if kind:
            raise ImageDecodeError(
                name,
                CORRUPT,
                f"starts like a {kind} file but its header is damaged or cut short",
                "re-export or re-upload it, or remove it",
            ) from error
        raise ImageDecodeError(
            name,
            NOT_AN_IMAGE,
            f"not an image file Pillow can read (starts with {data[:8]!r})",
            "remove it from the input or convert it to JPEG/PNG",
        ) from error
    except Exception as error:  # noqa: BLE001 - Pillow plugins raise OSError, SyntaxError, struct.error, ...
        reason, detail = _classify_decoder_error(error)
        raise ImageDecodeError(name, reason, detail, "re-upload it or remove it") from error


def _check_pixel_count(size: tuple[int, int], name: str, max_pixels: int) -> None:
    width, height = size
    if width * height > max_pixels:
        raise ImageDecodeError(
            name,
            TOO_LARGE,
            f"image is {width}x{height} = {width * height:,} pixels, over the limit of {max_pixels:,}",
            "downscale it, or raise inference.max_image_pixels in the job's "
            "config and touch the file (the next run redoes a file whose modification time changed)",
        )


def _load_pixels(image: Image.Image, name: str) -> None:
    """Decode pixel data now, so truncation and corruption surface here with a clear reason."""
    try:
        image.load()
    except Exception as error:  # noqa: BLE001 - decoders raise OSError, SyntaxError, ValueError, ...
        reason, detail = _classify_decoder_error(error, image.format)
        raise ImageDecodeError(name, reason, detail, "re-upload it or remove it") from error


def _classify_decoder_error(error: Exception, image_format: str | None = None) -> tuple[str, str]:
    kind = image_format or "image"
    text = str(error)
    if "truncated" in text.lower():
        return TRUNCATED, f"file is truncated: the {kind} data ends before the image is complete (Pillow: {text})"
    return CORRUPT, f"{kind} data is corrupt (Pillow: {type(error).__name__}: {text})"


# EXIF orientation -> the transposition that shows the stored pixels as a viewer does (the EXIF/TIFF table, as
# Pillow's ImageOps.exif_transpose applies it; that function also rewrites the metadata, which a damaged EXIF block
# can fail).
_ORIENTATION_TRANSPOSE = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}


def _exif_transposed(image: Image.Image) -> Image.Image:
    """The loaded image as a viewer shows it: a new image with the EXIF orientation applied, or `image` itself where
    there is nothing to apply (no tag, orientation 1, an unknown value, or a damaged EXIF block: as stored)."""
    method = _ORIENTATION_TRANSPOSE.get(_exif_orientation(image))
    return image if method is None else image.transpose(method)


REUSED_BUFFER_BYTES = 16 << 20  # 4 Mpx of RGB: Pillow's block size, the images it can share anyway


class _ReusedBuffer(threading.local):
    """This thread's decode buffer: uint8 [REUSED_BUFFER_BYTES], or None before the first use."""

    array: np.ndarray | None = None


_reused = _ReusedBuffer()


def _decode_into_reused_buffer(image: ImageFile.ImageFile) -> tuple[np.ndarray, ImagingCore] | None:
    """Point a not yet decoded RGB image at this thread's reused buffer (its load() then decodes into it, skipping
    the zero-filled image memory Pillow allocates). Returns (the read-only uint8
    [H, W, 4] view it decodes into, the Pillow image core over it), or None where it cannot: another mode, a
    larger image, no Image.fromarrow (Pillow < 11.2) or no pyarrow. The caller checks that the image still uses
    that memory after load(), so a decoder that allocates its own is never misread."""
    width, height = image.size
    size = width * height * 4
    if image.mode != "RGB" or not image.tile or size > REUSED_BUFFER_BYTES or not hasattr(Image, "fromarrow"):
        return None
    try:
        import pyarrow
    except ImportError:
        return None
    # Reuse only when nothing else refers to the buffer: an array returned before (a view of it) that a caller
    # still holds keeps it; this thread then starts a new one (getrefcount: the attribute and its own argument).
    if _reused.array is None or sys.getrefcount(_reused.array) > 2:
        _reused.array = np.empty(REUSED_BUFFER_BYTES, np.uint8)
    memory = _reused.array[:size]
    pixels = pyarrow.FixedSizeListArray.from_arrays(pyarrow.array(memory, type=pyarrow.uint8()), 4)
    target = Image.fromarrow(pixels, "RGB", (width, height))
    image.im = target.im
    view = memory.reshape(height, width, 4)
    view.flags.writeable = False
    return view, image.im


def _shared_rgbx(image: Image.Image) -> np.ndarray | None:
    """An RGB image's pixel memory without a copy: read-only uint8 [H, W, 4], the fourth byte padding (Pillow
    >= 11.2 shares its storage through the Arrow C data interface; the array keeps it alive after the image is
    closed). None where it cannot: another mode, no pyarrow, an older Pillow, or rows in more than one memory
    block (images over Pillow's 16 MiB block size)."""
    if image.mode != "RGB" or not hasattr(image, "__arrow_c_array__"):
        return None
    width, height = image.size
    try:
        import pyarrow

        pixels = pyarrow.array(image)  # fixed_size_list<uint8>[4], one per pixel
        return pixels.flatten().to_numpy(zero_copy_only=True).reshape(height, width, 4)
    except (ImportError, TypeError, ValueError):  # ValueError: "Image rows are not contiguous in memory"
        return None


def _to_rgb_array(image: Image.Image, name: str) -> np.ndarray:
    """Any Pillow mode -> writable uint8 [H, W, 3].

    Converted in bands of rows into one preallocated array, so no second full-size image or byte string exists
    (peak memory: Pillow's decoded image plus the result).
    """
    width, height = image.size
    if image.mode == "F":  # needs the whole image's range; float images are rare
        return _gray_to_rgb(_float_to_uint8(np.asarray(image, dtype=np.float64)))
    if image.mode == "RGB" and width * height <= _BAND_PIXELS:  # one band: one copy (no crop)
        return np.array(image)
    rgb = np.empty((height, width, 3), np.uint8)
    rows = max(1, _BAND_PIXELS // width)
    for top in range(0, height, rows):
        bottom = min(height, top + rows)
        rgb[top:bottom] = _band_to_rgb(image.crop((0, top, width, bottom)), name)
    return rgb


def _band_to_rgb(band: Image.Image, name: str) -> np.ndarray:
    """A band of rows -> uint8 [rows, W, 3], or [rows, W, 1] for gray (broadcast by the caller)."""
    mode = band.mode
    if mode == "RGB":
        return np.asarray(band)
    if mode.startswith("I;16"):
        return (np.asarray(band).astype(np.uint16) >> 8).astype(np.uint8)[:, :, None]
    if mode == "I":
        values = np.clip(np.asarray(band, dtype=np.int64), 0, 65535)
        return (values >> 8).astype(np.uint8)[:, :, None]
    if mode in ("P", "PA"):
        band = band.convert("RGBA")  # palette transparency handled by Pillow, then dropped below
    try:
        return np.asarray(band.convert("RGB"))
    except ValueError as error:
        raise ImageDecodeError(
            name,
            UNSUPPORTED_MODE,
            f"pixel mode {mode!r} cannot be converted to RGB",
            "convert it to an 8-bit RGB or grayscale JPEG/PNG",
        ) from error


def _float_to_uint8(values: np.ndarray) -> np.ndarray:
    """Float image [H, W] -> uint8 [H, W] (see the module docstring for the rule)."""
    values = np.where(np.isfinite(values), values, 0.0)
    low, high = (float(values.min()), float(values.max())) if values.size else (0.0, 0.0)
    if low >= 0.0 and high <= 1.0:
        scaled = values * 255.0
    elif low >= 0.0 and high <= 255.0:
        scaled = values
    else:
        scaled = (values - low) * (255.0 / (high - low))
    return np.clip(np.rint(scaled), 0, 255).astype(np.uint8)


def _gray_to_rgb(gray: np.ndarray) -> np.ndarray:
    return np.repeat(gray[:, :, None], 3, axis=2)


def _looks_like(data: bytes) -> str | None:
    for magic, kind in _MAGIC:
        if data.startswith(magic):
            return kind
    return None
