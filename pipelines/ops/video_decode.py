"""Executor side of video input, with PyAV (FFmpeg's libraries, bundled in its wheels: no system FFmpeg needed,
the same decoder on every executor; OpenCV's FFmpeg backend cannot seek by presentation timestamp nor report
packet timestamps, which exact segment boundaries need).

- `scan_video`: a cheap container scan (demux only, no decoding) of the first video stream's packet timestamps.
  Sorted, they are the frames in presentation order: frame i is the i-th smallest pts (0-based, counted from the
  stream start), its presentation time (pts - first pts) x time_base. A container whose readable packets fall
  short of what its header declares is truncated: the readable frames stay usable, the rest is reported.
- `decode_segment`: decodes frames [start, end) of a scanned video: seek to the segment's first pts (FFmpeg lands
  on the keyframe at or before it), decode, drop frames before the segment and stop after it. Decoders output
  frames in presentation order, B-frames included, so every frame of the video belongs to exactly one segment.
  Where a container seeks by decode timestamps (MP4 with B-frames) the keyframe found can lie after the
  segment's first frame: the seek is retried further back until the first decoded frame is not after it.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from pipelines.errors import SparkSegError

SEEK_BACK_SECONDS = (0.0, 1.0, 4.0, 16.0, 64.0)  # retries of a seek that landed after the segment's first frame


# A unit's segment_error reason for a video the store could not read (not a decode failure): "read.<error type>"
STORE_FAILURE = "read."


class VideoDecodeError(SparkSegError, ValueError):
    """A video (or one of its segments) that cannot be decoded; `reason` says which way (error_type
    VideoDecodeError.<reason> in errors/). Never raised out of a job: it becomes an errors/ row."""

    def __init__(self, message: str, reason: str, frame_index: int | None = None):
        super().__init__(message)
        self.reason = reason
        self.frame_index = frame_index  # the first frame not decoded, where known

    def __reduce__(self):  # picklable with its constructor's arguments
        return (type(self), (str(self), self.reason, self.frame_index))


@dataclass(frozen=True)
class VideoIndex:
    """What scan_video found: every readable frame's pts in presentation order, the stream's time base, and why
    the container ends early (None when it holds all the frames its header declares)."""

    frame_pts: list[int]
    time_base: Fraction
    declared_frames: int
    truncated: str | None = None

    @property
    def first_pts(self) -> int:
        return self.frame_pts[0]


def open_container(source):
    """`source`: a local file path, or the video's bytes (read from a store by the caller)."""
    import av

    target = io.BytesIO(source) if isinstance(source, (bytes, bytearray, memoryview)) else source
    try:
        container = av.open(target, mode="r")
    except av.error.FFmpegError as err:
        raise VideoDecodeError(f"not a readable video container: {err}", "unreadable") from None
    if not container.streams.video:
        container.close()
        raise VideoDecodeError("no video stream in the container", "no_video_stream")
    return container


def scan_video(source) -> VideoIndex:
    """Demux the first video stream's packets (no decoding) -> VideoIndex. Raises VideoDecodeError when no frame
    is readable at all."""
    import av

    if isinstance(source, (bytes, bytearray)) and not source:
        raise VideoDecodeError("empty file (0 bytes)", "empty")
    with open_container(source) as container:
        stream = container.streams.video[0]
        if stream.codec_context is None or stream.codec_context.name is None:
            raise VideoDecodeError(f"unsupported codec {stream.codec_tag!r}", "unsupported_codec")
        pts, stopped = [], None
        try:
            for packet in container.demux(stream):
                stamp = packet.pts if packet.pts is not None else packet.dts
                if stamp is not None and packet.size:
                    pts.append(int(stamp))
        except av.error.FFmpegError as err:
            stopped = str(err)
        declared = declared_frames(container, stream)
    if not pts:
        raise VideoDecodeError(f"no readable video frame{': ' + stopped if stopped else ''}", "no_frames")
    pts.sort()
    truncated = None
    if stopped is not None:
        truncated = f"demuxing stopped after {len(pts)} frames: {stopped}"
    elif declared > len(pts) + 1:  # +1: containers round their duration to a whole frame
        truncated = f"the container declares {declared} frames but only {len(pts)} are readable (truncated file?)"
    return VideoIndex(pts, Fraction(stream.time_base), max(declared, len(pts)), truncated)


def declared_frames(container, stream) -> int:
    """Frames the container's header promises: the stream's frame count, else its duration x average rate."""
    if stream.frames:
        return int(stream.frames)
    rate = stream.average_rate or stream.guessed_rate
    if stream.duration is not None and stream.time_base is not None and rate:
        return int(round(float(stream.duration * stream.time_base * rate)))
    if container.duration and rate:
        return int(round(container.duration / 1_000_000 * float(rate)))
    return 0


@dataclass(frozen=True)
class DecodedFrame:
    frame_index: int
    timestamp_s: float
    rgb: np.ndarray  # HxWx3 uint8


def timestamp_seconds(pts: int, first_pts: int, time_base: Fraction) -> float:
    return float((pts - first_pts) * time_base)


def decode_segment(
    source,
    start: int,
    frame_pts: list[int],
    first_pts: int,
    time_base: Fraction,
    keep,
    previous_timestamp: float | None = None,
) -> Iterator[DecodedFrame]:
    """Frames start .. start + len(frame_pts) - 1 of the video (their pts from scan_video), in presentation order,
    those for which keep(frame_index, timestamp_s, previous_timestamp_s) is true, as RGB (`previous_timestamp`: the
    frame before the segment's, None for the first segment). Raises VideoDecodeError
    (reason "truncated" or "corrupt") naming the first frame not decoded; the frames before it have been yielded."""
    import av

    index_of = {int(p): start + offset for offset, p in enumerate(frame_pts)}
    first, last = int(frame_pts[0]), int(frame_pts[-1])
    end = start + len(frame_pts)
    expected = start
    with open_container(source) as container:
        stream = container.streams.video[0]
        frames = seek_and_decode(container, stream, first, time_base)
        previous = previous_timestamp
        try:
            for frame in frames:
                if frame.pts is None or frame.pts < first:
                    continue
                if frame.pts > last:
                    break
                index = index_of.get(int(frame.pts))
                if index is None or index < expected:
                    continue
                if index > expected:
                    raise VideoDecodeError(
                        f"frames {expected}..{index - 1} of segment [{start}, {end}) were not decoded",
                        "corrupt",
                        expected,
                    )
                timestamp = timestamp_seconds(frame.pts, first_pts, time_base)
                if keep(index, timestamp, previous):
                    yield DecodedFrame(index, timestamp, frame.to_ndarray(format="rgb24"))
                previous = timestamp
                expected = index + 1
        except av.error.FFmpegError as err:
            raise VideoDecodeError(
                f"decoding stopped at frame {expected} of segment [{start}, {end}): {err}", "corrupt", expected
            ) from None
    if expected < end:
        raise VideoDecodeError(
            f"frames {expected}..{end - 1} of segment [{start}, {end}) could not be decoded "
            "(truncated or corrupt data)",
            "truncated",
            expected,
        )


def frames_at(source, indices: set[int]) -> dict[int, np.ndarray]:
    """Frames `indices` (0-based, in presentation order, as scan_video counts them) of a video as RGB, decoded from
    its start: for a few frames of a report, not for a job. Frames past a truncated end are absent."""
    import av

    found: dict[int, np.ndarray] = {}
    if not indices:
        return found
    last = max(indices)
    with open_container(source) as container:
        try:
            for index, frame in enumerate(container.decode(container.streams.video[0])):
                if index in indices:
                    found[index] = frame.to_ndarray(format="rgb24")
                if index >= last:
                    break
        except av.error.FFmpegError:
            pass  # truncated or corrupt: the frames decoded so far
    return found


def seek_and_decode(container, stream, first_pts: int, time_base: Fraction):
    """A frame iterator positioned at or before the frame with pts `first_pts`: seek to the keyframe before it
    (retried further back while the first decoded frame comes after it)."""
    for back in SEEK_BACK_SECONDS:
        target = first_pts - int(back / time_base) if back else first_pts
        if target <= 0 and back:
            break
        container.seek(target, stream=stream, backward=True, any_frame=False)
        frames = container.decode(stream)
        head = next((f for f in frames if f.pts is not None), None)
        if head is None:
            break
        if head.pts <= first_pts:
            return _chain(head, frames)
    container.seek(0, stream=stream, backward=True, any_frame=False)  # from the start: always complete
    return container.decode(stream)


def _chain(head, rest):
    yield head
    yield from rest
