"""Torch-free numeric ops: decode, resize, preprocess, YOLACT postprocess, masks, video frames."""
