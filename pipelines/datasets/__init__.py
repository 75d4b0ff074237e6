"""Annotated image sets: one in-memory form (``schema``), Pascal VOC and COCO readers/writers, masks through
pycocotools, a deterministic train/val split, and the synthetic road-distress generator (``synthetic_roads``)."""

from pipelines.datasets.coco import coco_to_dataset, dataset_to_coco, read_coco, write_coco
from pipelines.datasets.masks import decode_mask, mask_area, mask_box, mask_iou, rle_from_mask, to_coco_rle
from pipelines.datasets.schema import (
    Annotation,
    AnnotationError,
    Category,
    Dataset,
    ImageRecord,
    PolygonMask,
    RleMask,
    categories_from_names,
)
from pipelines.datasets.split import split_train_val
from pipelines.datasets.voc import read_voc_dir, read_voc_files, read_voc_xml, voc_xml_string, write_voc_dir

__all__ = [
    "Annotation",
    "AnnotationError",
    "Category",
    "Dataset",
    "ImageRecord",
    "PolygonMask",
    "RleMask",
    "categories_from_names",
    "coco_to_dataset",
    "dataset_to_coco",
    "decode_mask",
    "mask_area",
    "mask_box",
    "mask_iou",
    "read_coco",
    "read_voc_dir",
    "read_voc_files",
    "read_voc_xml",
    "rle_from_mask",
    "split_train_val",
    "to_coco_rle",
    "voc_xml_string",
    "write_coco",
    "write_voc_dir",
]
