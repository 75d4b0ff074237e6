"""decode_image / image_size on the bad-input corpus and on every pixel mode we promise to handle."""

from __future__ import annotations

import io
import pickle

import numpy as np
import pytest
from PIL import Image, ImageOps

from pipelines.ops.image_decode import (
    REASONS,
    ImageDecodeError,
    decode_image,
    decode_image_reduced,
    image_size,
    reuse_decode_memory,
)
from tests.bad_inputs import (
    CMYK_QUADRANTS,
    LARGE_NAME,
    PALETTE_COLORS,
    build_bad_input_corpus,
    exif_pattern,
    gray16_pattern,
    png_header_only,
)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    directory = tmp_path_factory.mktemp("bad_inputs")
    return directory, build_bad_input_corpus(directory)


def _decode_file(corpus, name: str) -> np.ndarray:
    directory, _ = corpus
    return decode_image((directory / name).read_bytes(), f"s3/{name}")


def _encode(image: Image.Image, image_format: str, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, image_format, **options)
    return buffer.getvalue()


def test_every_corpus_file_decodes_to_its_expected_outcome(corpus):
    directory, expected = corpus
    outcomes = {}
    for name in expected:
        try:
            rgb = decode_image((directory / name).read_bytes(), f"s3/{name}")
        except ImageDecodeError as error:
            outcomes[name] = error.reason
            assert f"s3/{name}" in str(error), "the message names the input"
        else:
            outcomes[name] = "ok"
            assert rgb.dtype == np.uint8 and rgb.ndim == 3 and rgb.shape[2] == 3 and rgb.flags.writeable
            if name == LARGE_NAME:
                assert rgb.shape == (8000, 8000, 3)
                assert np.abs(rgb[::997, ::997].astype(int) - (90, 140, 200)).max() <= 2
    assert outcomes == expected
    assert set(expected.values()) - {"ok"} <= set(REASONS)


def test_corpus_is_deterministic_and_small(tmp_path):
    first = build_bad_input_corpus(tmp_path / "a", include_large=False)
    second = build_bad_input_corpus(tmp_path / "b", include_large=False)
    assert first == second and LARGE_NAME not in first
    for name in first:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
        assert (tmp_path / "a" / name).stat().st_size < 10_000, name


def test_errors_are_value_errors_naming_the_input_and_what_to_do(corpus):
    directory, _ = corpus
    with pytest.raises(ValueError) as caught:
        decode_image((directory / "truncated.jpg").read_bytes(), "s3/x.jpg")
    error = caught.value
    assert isinstance(error, ImageDecodeError) and error.reason == "truncated" and error.name == "s3/x.jpg"
    assert str(error).startswith("s3/x.jpg: file is truncated")
    assert "re-upload" in str(error)
    copy = pickle.loads(pickle.dumps(error))
    assert (str(copy), copy.reason, copy.name) == (str(error), error.reason, error.name)


def test_one_pixel_image_is_valid(corpus):
    rgb = _decode_file(corpus, "one_pixel.png")
    assert rgb.shape == (1, 1, 3) and rgb[0, 0].tolist() == [200, 100, 50]


def test_exif_orientation_6_is_rotated_clockwise(corpus):
    rgb = _decode_file(corpus, "exif_orientation_6.jpg")
    expected = np.rot90(exif_pattern(), k=-1)  # [48, 32, 3]
    assert rgb.shape == expected.shape == (48, 32, 3)
    # Region centres, away from JPEG ringing at colour edges: red top-left, blue bottom-left, green band right.
    assert np.abs(rgb[10, 10].astype(int) - (255, 0, 0)).max() < 20
    assert np.abs(rgb[38, 10].astype(int) - (0, 0, 255)).max() < 20
    assert np.abs(rgb[24, 29].astype(int) - (0, 255, 0)).max() < 20
    assert np.abs(rgb.astype(int) - expected).mean() < 8


@pytest.mark.parametrize("orientation", range(1, 9))
def test_every_exif_orientation_gives_what_pillows_exif_transpose_shows(orientation):
    pixels = np.random.default_rng(orientation).integers(0, 256, (24, 40, 3), dtype=np.uint8)  # not square
    exif = Image.Exif()
    exif[0x0112] = orientation
    data = _encode(Image.fromarray(pixels), "JPEG", quality=95, exif=exif.tobytes())
    with Image.open(io.BytesIO(data)) as image:
        shown = np.asarray(ImageOps.exif_transpose(image).convert("RGB"))
    assert shown.shape == ((40, 24, 3) if orientation >= 5 else (24, 40, 3))
    np.testing.assert_array_equal(decode_image(data, "o.jpg"), shown)
    np.testing.assert_array_equal(decode_image(data, "o.jpg", shared_memory=True)[:, :, :3], shown)
    reduced, size = decode_image_reduced(data, "o.jpg", (8, 8))
    assert size == (shown.shape[1], shown.shape[0]) and reduced.shape[2] == 3
    assert (reduced.shape[0] > reduced.shape[1]) == (shown.shape[0] > shown.shape[1])


def test_cmyk_jpeg_gives_the_expected_rgb(corpus):
    rgb = _decode_file(corpus, "cmyk.jpg")
    centres = [(8, 8), (8, 24), (24, 8), (24, 24)]  # (row, col) of the four quadrants, as built
    for (row, col), (name, (_, expected)) in zip(centres, CMYK_QUADRANTS.items()):
        assert np.abs(rgb[row, col].astype(int) - expected).max() < 12, name


def test_16_bit_png_keeps_the_high_byte(corpus):
    rgb = _decode_file(corpus, "gray16.png")
    expected = (gray16_pattern() >> 8).astype(np.uint8)
    assert np.array_equal(rgb[..., 0], expected)
    assert np.array_equal(rgb[..., 0], rgb[..., 1]) and np.array_equal(rgb[..., 1], rgb[..., 2])
    assert rgb.min() == 0 and rgb.max() == 255  # full range kept, not clipped


def test_grayscale_jpeg_has_three_equal_channels(corpus):
    rgb = _decode_file(corpus, "gray.jpg")
    assert rgb.shape == (32, 48, 3)
    assert np.array_equal(rgb[..., 0], rgb[..., 2]) and rgb.std() > 10


def test_rgba_png_drops_alpha_and_keeps_colour(corpus):
    rgb = _decode_file(corpus, "rgba.png")
    assert (rgb.reshape(-1, 3) == (200, 60, 20)).all()  # also where alpha is 0


def test_palette_png_with_transparency(corpus):
    rgb = _decode_file(corpus, "palette_transparent.png")
    assert rgb[0, 0].tolist() == list(PALETTE_COLORS[0])  # transparent index keeps its palette colour
    assert rgb[0, 15].tolist() == list(PALETTE_COLORS[1])
    assert rgb[15, 0].tolist() == list(PALETTE_COLORS[2])
    assert rgb[15, 15].tolist() == list(PALETTE_COLORS[3])


def test_float_tiff_in_unit_range_is_scaled_by_255(corpus):
    rgb = _decode_file(corpus, "float32.tif")
    y, x = np.mgrid[0:32, 0:48]
    expected = (x * 3 + y * 2) % 256
    assert np.abs(rgb[..., 1].astype(int) - expected).max() <= 1


def test_float_tiff_outside_0_255_is_stretched():
    values = np.array([[-5.0, 0.0], [5.0, 1000.0]], np.float32)
    rgb = decode_image(_encode(Image.fromarray(values), "TIFF"), "f.tif")
    assert rgb[..., 0].tolist() == [[0, 1], [3, 255]]


def test_int32_mode_is_treated_as_16_bit_and_clamped():
    values = np.array([[-7, 255], [256, 65535], [70000, 32768]], np.int32)
    rgb = decode_image(_encode(Image.fromarray(values), "TIFF"), "i.tif")
    assert rgb[..., 0].tolist() == [[0, 0], [1, 255], [255, 128]]


def test_la_and_bilevel_images():
    la = Image.fromarray(np.dstack([np.full((4, 4), 77, np.uint8), np.zeros((4, 4), np.uint8)]), mode="LA")
    assert (decode_image(_encode(la, "PNG"), "la.png") == 77).all()
    bilevel = Image.new("1", (5, 3), 1)
    assert (decode_image(_encode(bilevel, "PNG"), "bw.png") == 255).all()


def test_animated_gif_gives_its_first_frame():
    frames = [Image.new("RGB", (6, 4), color) for color in ((255, 0, 0), (0, 0, 255))]
    data = _encode(frames[0], "GIF", save_all=True, append_images=frames[1:])
    rgb = decode_image(data, "anim.gif")
    assert rgb.shape == (4, 6, 3) and rgb[0, 0].tolist() == [255, 0, 0]


def test_pixel_limit_is_checked_from_the_header_before_decoding():
    # No pixel data follows the header: reaching the decoder fails as "corrupt" (no image data), not "too_large".
    header_only = png_header_only(300, 200)
    with pytest.raises(ImageDecodeError) as caught:
        decode_image(header_only, "h.png", max_pixels=300 * 200 - 1)
    assert caught.value.reason == "too_large" and "300x200" in str(caught.value)
    with pytest.raises(ImageDecodeError) as caught:
        decode_image(header_only, "h.png", max_pixels=300 * 200)
    assert caught.value.reason == "corrupt"


def test_max_pixels_allows_exactly_the_limit():
    data = _encode(Image.new("RGB", (8, 8), (1, 2, 3)), "PNG")
    assert decode_image(data, "a.png", max_pixels=64).shape == (8, 8, 3)
    with pytest.raises(ImageDecodeError, match="raise inference.max_image_pixels in the job's config and touch"):
        decode_image(data, "a.png", max_pixels=63)


def test_truncated_png_is_truncated():
    noise = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    data = _encode(Image.fromarray(noise), "PNG")
    with pytest.raises(ImageDecodeError) as caught:
        decode_image(data[: len(data) // 2], "half.png")
    assert caught.value.reason == "truncated"


def test_jpeg_cut_inside_its_header_is_truncated():
    data = _encode(Image.new("RGB", (16, 16)), "JPEG")
    with pytest.raises(ImageDecodeError) as caught:
        decode_image(data[:200], "head.jpg")
    assert caught.value.reason == "truncated"


def test_image_size_reads_the_header_only(corpus):
    directory, _ = corpus
    assert image_size(png_header_only(12_000, 9_000)) == (12_000, 9_000)
    assert image_size((directory / "exif_orientation_6.jpg").read_bytes()) == (48, 32)  # as stored
    assert image_size((directory / LARGE_NAME).read_bytes()) == (8000, 8000)
    for name, reason in [
        ("empty.jpg", "empty"),
        ("text_named.png", "not_an_image"),
        ("bomb_header_30000x30000.png", "too_large"),
    ]:
        with pytest.raises(ImageDecodeError) as caught:
            image_size((directory / name).read_bytes(), name)
        assert caught.value.reason == reason


def test_bundled_sample_images_decode_and_are_documented(repo_root):
    directory = repo_root / "samples" / "images"
    images = sorted(path for path in directory.iterdir() if path.suffix in (".jpg", ".png"))
    readme = (directory / "README.md").read_text()
    assert 6 <= len(images) <= 12  # a small demo set; the size bound below is what matters
    assert sum(path.stat().st_size for path in images) < 1_000_000
    for path in images:
        rgb = decode_image(path.read_bytes(), str(path))
        assert max(rgb.shape[:2]) <= 640 and rgb.std() > 10, path.name
        assert f"`{path.name}`" in readme, f"{path.name} has no source/license line in samples/images/README.md"


def test_reduced_jpeg_decode_keeps_the_full_size_and_at_least_the_network_side(corpus):
    """JPEG draft decode (inference.jpeg_draft): 1/2, 1/4 or 1/8 scale with both sides >= the network input's larger
    side; the size reported is the full image's (EXIF orientation applied), which is what masks are made at."""
    rng = np.random.default_rng(0)
    for width, height in [(1920, 1080), (1080, 1920), (640, 480), (300, 200), (2049, 257)]:
        data = _encode(Image.fromarray(rng.integers(0, 255, (height, width, 3), dtype=np.uint8)), "JPEG")
        rgb, size = decode_image_reduced(data, "a.jpg", (256, 256))
        assert size == (width, height)
        assert min(rgb.shape[:2]) >= min(256, width, height)
        scale = width // rgb.shape[1]
        assert scale in (1, 2, 4, 8) and (scale == 1 or min(width, height) // (2 * scale) < 256)
    # EXIF orientation 6: the full size is the rotated one, as decode_image gives it
    directory, _ = corpus
    data = (directory / "exif_orientation_6.jpg").read_bytes()
    rgb, size = decode_image_reduced(data, "exif.jpg", (8, 8))
    full = decode_image(data, "exif.jpg")
    assert size == (full.shape[1], full.shape[0]) == (32, 48)
    assert rgb.shape[0] > rgb.shape[1]  # rotated too
    # other formats decode fully, identical to decode_image
    png = _encode(Image.fromarray(rng.integers(0, 255, (600, 800, 3), dtype=np.uint8)), "PNG")
    rgb, size = decode_image_reduced(png, "a.png", (256, 256))
    np.testing.assert_array_equal(rgb, decode_image(png, "a.png"))
    assert size == (800, 600)
    with pytest.raises(ImageDecodeError, match="over the limit"):
        decode_image_reduced(data, "exif.jpg", (8, 8), max_pixels=100)


def test_decoding_with_reused_memory_blocks_gives_the_same_pixels():
    rng = np.random.default_rng(0)
    encoded = []
    for size in ((1920, 1080), (640, 480), (1920, 1080)):
        buffer = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(buffer, "JPEG")
        encoded.append(buffer.getvalue())
    before = [decode_image(data, "x.jpg") for data in encoded]
    reuse_decode_memory()
    assert Image.core.get_blocks_max() >= 2
    for data, expected in zip(encoded, before):
        np.testing.assert_array_equal(decode_image(data, "x.jpg"), expected)


def test_shared_memory_decode_gives_the_same_pixels_without_a_copy():
    rng = np.random.default_rng(1)
    pixels = rng.integers(0, 256, (480, 640, 3), dtype=np.uint8)
    jpeg, png = _encode(Image.fromarray(pixels), "JPEG", quality=90), _encode(Image.fromarray(pixels), "PNG")
    gray = _encode(Image.fromarray(pixels[:, :, 0]), "PNG")
    shared = [decode_image(data, "x", shared_memory=True) for data in (jpeg, png, gray)]
    # RGB: Pillow's own 4-byte pixels, read-only, where Pillow shares them (>= 11.2; older ones: decode_image's
    # copy); the first three channels are decode_image's pixels
    shares = hasattr(Image.Image, "__arrow_c_array__")
    for data, rgbx in zip((jpeg, png), shared):
        assert rgbx.shape == (480, 640, 4) and not rgbx.flags.writeable if shares else rgbx.shape == (480, 640, 3)
        np.testing.assert_array_equal(rgbx[:, :, :3], decode_image(data, "x"))
    np.testing.assert_array_equal(shared[1][:, :, :3], pixels)
    # other modes are converted as usual
    np.testing.assert_array_equal(shared[2], decode_image(gray, "x"))
    # the shared memory outlives its image while other images are decoded (freed blocks are reused)
    reuse_decode_memory()
    for _ in range(4):
        decode_image(_encode(Image.new("RGB", (1500, 1500), (7, 8, 9)), "PNG"), "other", shared_memory=True)
    np.testing.assert_array_equal(shared[1][:, :, :3], pixels)


def test_shared_memory_decode_of_a_rotated_or_held_image_keeps_its_pixels(corpus):
    # Executors decode RGB images into one buffer per thread, reused once no returned array refers to it. An
    # EXIF-rotated image is decoded there, then rotated into new memory: the rotated pixels are what comes back.
    directory, _ = corpus
    rotated = (directory / "exif_orientation_6.jpg").read_bytes()
    shared = decode_image(rotated, "rotated.jpg", shared_memory=True)
    np.testing.assert_array_equal(shared[:, :, :3], decode_image(rotated, "rotated.jpg"))
    # arrays held by the caller are never decoded over; released ones are reused (the same memory comes back)
    rng = np.random.default_rng(2)
    images = [rng.integers(0, 256, (64 + 8 * i, 96, 3), dtype=np.uint8) for i in range(3)]
    held = [
        decode_image(_encode(Image.fromarray(pixels), "PNG"), f"{i}.png", shared_memory=True)
        for i, pixels in enumerate(images)
    ]
    for rgbx, pixels in zip(held, images):
        np.testing.assert_array_equal(rgbx[:, :, :3], pixels)
    data = _encode(Image.fromarray(images[0]), "PNG")
    first = decode_image(data, "again.png", shared_memory=True).__array_interface__["data"][0]
    second = decode_image(data, "again.png", shared_memory=True).__array_interface__["data"][0]
    if hasattr(Image, "fromarrow"):  # Pillow >= 11.2 decodes into the reused buffer; older ones: a copy each time
        assert first == second


def test_shared_memory_decode_of_an_image_over_one_memory_block_is_a_copy():
    # Pillow keeps images over its 16 MiB block in several blocks, which it cannot share: decode_image's array
    rgb = np.zeros((1500, 3000, 3), np.uint8)
    rgb[::7, ::5] = (200, 100, 50)
    data = _encode(Image.fromarray(rgb), "PNG")
    shared = decode_image(data, "big.png", shared_memory=True)
    assert shared.shape == (1500, 3000, 3)
    np.testing.assert_array_equal(shared, rgb)
