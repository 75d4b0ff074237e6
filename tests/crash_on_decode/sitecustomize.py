"""Test-only fault injection for tests/test_faults.py (never on a production path).

A Python process started with this directory on PYTHONPATH and SPARKSEG_CRASH_ON=<substring> in its environment
dies inside the image decoder, as a decoder segfault would, for an input whose path contains the substring. Spark's
Python workers inherit PYTHONPATH and the environment from the job process, so the job's own executor code runs
unchanged up to the decoder. (Python imports `sitecustomize` at start-up, after the venv's .pth files, so the
patch is in place before anything imports the decoder by name.)
"""

import os

_NEEDLE = os.environ.get("SPARKSEG_CRASH_ON")
if _NEEDLE:
    import pipelines.ops.image_decode as _image_decode

    _real_decode_image = _image_decode.decode_image

    def _decode_or_crash(data, name, *args, **kwargs):
        if _NEEDLE in name:
            os._exit(134)
        return _real_decode_image(data, name, *args, **kwargs)

    _image_decode.decode_image = _decode_or_crash
