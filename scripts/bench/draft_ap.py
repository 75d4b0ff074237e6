"""Box and mask AP of the executor function with `inference.jpeg_draft` (a reduced-size JPEG decode: the model sees
other pixels) against the full decode, on labelled synthetic road scenes with exact masks
(pipelines.datasets.synthetic_roads, JPEG quality 90) at sizes where the draft decode applies (1/2 and 1/4 scale
for a 256 px network). Read by scripts/bench_executor.py (--draft-ap-images)."""

from __future__ import annotations

from pathlib import Path

SEED = 20261201
SIZES = ((1280, 960), (1920, 1080))  # 1/2 and 1/4 DCT scale for a 256 px input
GROUPS = {"blobs": ("pothole", "patch", "puddle"), "crack": ("crack",)}
KEYS = ("box_ap", "box_ap50", "mask_ap", "mask_ap50")


def draft_ap(model_dir: Path, work: Path, count: int, batch_size: int = 8) -> dict:
    """{"images": count per size, "sizes": {"WxH": {"full": AP report, "draft": AP report}}}: the current code,
    f32, 1 thread, every instance above the manifest's score threshold, RLE masks."""
    from pipelines.datasets.synthetic_roads import RoadSceneConfig, generate_road_dataset
    from pipelines.inference.inference_tasks import inference_task_class
    from pipelines.inference.model_manifest import load_manifest
    from pipelines.inference.openvino_runtime import RuntimeSettings
    from pipelines.inference.single_process import local_file_records
    from pipelines.io.storage import Location
    from pipelines.report.evaluate import ap_report, load_ground_truth, results_from_rows

    manifest = load_manifest(model_dir, verify=True)
    result = {"images": count, "sizes": {}}
    for width, height in SIZES:
        data = work / f"draft-ap-{width}x{height}-{count}"
        if not (data / "annotations.json").is_file():
            generate_road_dataset(data, count, SEED, RoadSceneConfig(width=width, height=height, formats=("coco",)))
        ground_truth = load_ground_truth(data / "annotations.json")
        paths = sorted((data / "images").iterdir())
        by_name = {Path(im["file_name"]).name: im["id"] for im in ground_truth.dataset["images"]}
        image_ids = {"file:" + str(p.resolve()): by_name[p.name] for p in paths}
        category_ids = {c["name"]: c["id"] for c in ground_truth.dataset["categories"]}
        reports = {}
        for name, draft in (("full", False), ("draft", True)):
            task = inference_task_class(manifest.model)(
                model_dir=str(manifest.root),
                model_sha256=manifest.model_sha256,
                class_names=tuple(manifest.class_names),
                input_spec=manifest.input,
                postprocess=dict(manifest.postprocess),
                settings=RuntimeSettings(precision="f32", threads=1, streams=1),
                output=Location(str(work / "scratch")),
                input_root=str(data / "images"),
                masks="rle",
                jpeg_draft=draft,
            )
            rows = []
            for start in range(0, len(paths), batch_size):
                rows.extend(task.process_batch(local_file_records(paths[start : start + batch_size])))
            failed = [r["error_message"] for r in rows if r["status"] != "ok"]
            if failed:
                raise RuntimeError(f"{len(failed)} images failed (first: {failed[0]})")
            reports[name] = ap_report(ground_truth, results_from_rows(rows, image_ids, category_ids), GROUPS)
        result["sizes"][f"{width}x{height}"] = reports
    return result


def report_lines(rows: list[dict]) -> list[str]:
    """The bench report's section for rows with a "draft_ap" (AP in points, x 100)."""
    measured = [r for r in rows if r.get("draft_ap")]
    if not measured:
        return []
    lines = [
        "",
        "## inference.jpeg_draft: AP against the full decode",
        "",
        "Synthetic road scenes with exact masks (pipelines.datasets.synthetic_roads, seed %d, JPEG quality 90), the "
        "executor function in one process, f32, masks as RLE, the manifest's score threshold; AP@[.5:.95] and AP50 "
        "in points. The setting stays off by default unless AP moves by less than 0.5 points." % SEED,
        "",
        "| model | image size | images | decode | " + " | ".join(KEYS) + " |",
        "|---|---|---|---|" + "---|" * len(KEYS),
    ]
    for r in measured:
        ap = r["draft_ap"]
        for size, reports in ap["sizes"].items():
            for name in ("full", "draft"):
                cells = [f"{100 * reports[name][k]:.2f}" for k in KEYS]
                lines.append(f"| {r['model']} | {size} | {ap['images']} | {name} | " + " | ".join(cells) + " |")
            delta = [f"{100 * (reports['draft'][k] - reports['full'][k]):+.2f}" for k in KEYS]
            lines.append(f"| {r['model']} | {size} | {ap['images']} | draft - full | " + " | ".join(delta) + " |")
    return lines
