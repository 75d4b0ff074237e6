"""Helpers of `scripts/bench.py` (`make bench`): bench images, the one-process runners (PyTorch eager, ONNX Runtime,
OpenVINO), Spark's own predict_batch_udf recipe, and the report. Runners that measure a row run as their own
process (`python scripts/bench/<runner>.py ...`) so that each row's peak memory is its own."""
