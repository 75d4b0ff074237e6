"""The result tables: schema rows, writers, incremental views, counts index, COCO export, evaluation."""
