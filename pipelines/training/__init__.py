"""Distributed YOLACT training on Spark (TorchDistributor, gloo on CPU). Needs the `train` extra (torch).

Modules, one concern each:
- ``config``: the training config (conf/train_yolact.yaml) as dataclasses.
- ``prepare``: Spark turns images + COCO annotations into Parquet shards (bad rows counted and skipped).
- ``shards``, ``augment``, ``batches``: a rank reads its rows of the shards, augments them (SSD-style), batches.
- ``sampler``: global batches split into micro-batches, the same whatever the strategy and world size.
- ``boxes``, ``yolact_loss``: prior matching and the YOLACT loss.
- ``stages``, ``pipeline``, ``strategies``: local / ddp / pipeline (GPipe) / hybrid training steps.
- ``checkpoints``, ``evaluate``, ``trainer``: the per-rank loop, checkpoints, COCO AP on the val split.
- ``launcher``, ``tracking``, ``progress``: TorchDistributor launch, MLflow + PNG plots, driver progress bar.
"""
