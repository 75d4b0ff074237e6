"""python -m pipelines.report.evaluate: COCO AP of what the job wrote, torch-free, the same numbers as the in-process
evaluation tests/test_training_default_model.py gates on (one implementation); per-class counts above 0.5 match the
generator's ground truth within the bundled model's known recall."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from pipelines.report.evaluate import EvaluationError, evaluate_output
from tests.conftest import REPO
from tests.fixtures_evaluation import ROAD_GROUPS

# Run the CLI in a fresh interpreter and prove inference users need neither torch nor Spark to evaluate.
CLI = (
    "import runpy, sys; sys.argv = ['pipelines.report.evaluate'] + sys.argv[1:]\n"
    "try:\n    runpy.run_module('pipelines.report.evaluate', run_name='__main__')\n"
    "except SystemExit as done:\n    code = done.code\n"
    "heavy = sorted(m for m in ('torch', 'pyspark') if m in sys.modules)\n"
    "assert not heavy, f'pipelines.report.evaluate imported {heavy}'\nsys.exit(code)\n"
)


def copy_output(src, dst):
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("masks", "_sparkseg_attempts"))
    return dst


def test_evaluate_cli_reproduces_the_training_test_ap_without_torch(bundled_val_run, tmp_path):
    out = copy_output(bundled_val_run.output, tmp_path / "out")
    groups = [f"--group={name}={','.join(names)}" for name, names in ROAD_GROUPS.items()]
    done = subprocess.run(
        [sys.executable, "-c", CLI, "--output", str(out), "--annotations", str(bundled_val_run.annotations), *groups],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert f"-> {out / 'evaluation.json'}" in done.stdout
    written = json.loads((out / "evaluation.json").read_text())
    in_process = evaluate_output(bundled_val_run.output, bundled_val_run.annotations, groups=ROAD_GROUPS)
    assert written["overall"] == in_process["overall"]  # exactly: one implementation
    assert written["per_class"] == in_process["per_class"]
    assert written["overall"]["mask_ap_blobs"] >= 0.5
    assert set(written["overall"]) >= {"box_ap", "box_ap50", "mask_ap", "mask_ap_blobs", "mask_ap_crack"}

    # The demo's claim: per-class counts above 0.5 match the ground truth within the model's known recall.
    for name in ROAD_GROUPS["blobs"]:
        entry = written["per_class"][name]
        assert entry["recall"] >= 0.8, (name, entry)
        assert entry["detections"] <= 1.3 * entry["ground_truth"], (name, entry)


def test_evaluate_names_what_does_not_match(bundled_val_run, tmp_path):
    foreign = json.loads(bundled_val_run.annotations.read_text())
    for image in foreign["images"]:
        image["file_name"] = "elsewhere_" + image["file_name"]
    path = tmp_path / "foreign.json"
    path.write_text(json.dumps(foreign))
    with pytest.raises(EvaluationError, match="none of its 40 image file names"):
        evaluate_output(bundled_val_run.output, path)
    with pytest.raises(EvaluationError, match="no such annotations file"):
        evaluate_output(bundled_val_run.output, tmp_path / "missing.json")
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(EvaluationError, match=r"list\.json: required COCO key 'images' is missing"):
        evaluate_output(bundled_val_run.output, tmp_path / "list.json")


def test_annotations_that_are_not_json_are_one_line_exit_2(bundled_val_run, tmp_path):
    (tmp_path / "cut.json").write_text('{"images": [{"id": 1,')
    (tmp_path / "binary.json").write_bytes(bytes(range(200, 256)))
    for name, problem in (("cut.json", "malformed JSON at line 1, column 22"), ("binary.json", "not UTF-8 text")):
        done = subprocess.run(
            [sys.executable, "-c", CLI, "--output", str(bundled_val_run.output), "--annotations", str(tmp_path / name)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: {tmp_path / name}: {problem}"), done.stderr


def test_a_labelled_sample_in_a_large_output_gives_its_own_ap_holding_its_rows_only(bundled_val_run, tmp_path):
    """The annotated images' rows among 4,000 others (30 instances with masks each, of this model, in another file):
    the same evaluation as over the annotated run alone, holding a fraction of the memory read_output would
    (tracemalloc counts the same allocations on every machine)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipelines.report.tables import read_output
    from tests.test_render import traced_peak

    out = copy_output(bundled_val_run.output, tmp_path / "out")
    first = next((out / "detections").rglob("*.parquet"))
    schema = pq.read_schema(first)
    model = pq.read_table(first, columns=["model_name", "model_sha256", "run_id"]).to_pylist()[0]
    rng = np.random.default_rng(5)
    n, per_image = 4000, 30
    instances = [
        [
            {
                "class_id": 1,
                "class_name": "pothole",
                "score": float(score),
                "box": [0, 0, 8, 8],
                "mask": {"size": [480, 640], "counts": "x" * 120},
            }
            for score in rng.random(per_image)
        ]
        for _ in range(n)
    ]
    extra = {
        "path": [f"file:/elsewhere/unlabelled_{i:05d}.jpg" for i in range(n)],
        "width": [640] * n,
        "height": [480] * n,
        "instances": instances,
        **{key: [value] * n for key, value in model.items()},
    }
    columns = {field.name: pa.array(extra.get(field.name, [None] * n), field.type) for field in schema}
    pq.write_table(pa.table(columns, schema=schema), out / "detections" / "part-unlabelled.parquet")

    report, held = traced_peak(lambda: evaluate_output(out, bundled_val_run.annotations, groups=ROAD_GROUPS))
    _, everything = traced_peak(lambda: read_output(out))
    alone = evaluate_output(bundled_val_run.output, bundled_val_run.annotations, groups=ROAD_GROUPS)
    assert report["overall"] == alone["overall"] and report["per_class"] == alone["per_class"]
    assert report["images"] == alone["images"] == 40
    assert held < everything / 4, (held, everything)


def test_images_are_matched_by_the_end_of_their_path_and_an_ambiguous_name_is_refused(bundled_val_run, tmp_path):
    """An annotated `road_00001.jpg` beside another `road_00001.jpg` of the output in another folder: refused (by
    base name alone, both images' detections were scored against one image's ground truth); given with its folder
    (`images/road_00001.jpg`), it is told apart and the AP is that of the annotated run alone."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = copy_output(bundled_val_run.output, tmp_path / "out")
    first = next((out / "detections").rglob("*.parquet"))
    [row] = pq.read_table(first).slice(0, 1).to_pylist()
    twin = {**row, "path": "file:/elsewhere/" + row["path"].rsplit("/", 1)[1]}
    pq.write_table(pa.Table.from_pylist([twin], schema=pq.read_schema(first)), out / "detections" / "part-twin.parquet")
    with pytest.raises(EvaluationError, match=r"is the end of two paths of .*; give its file_name with the folders"):
        evaluate_output(out, bundled_val_run.annotations)

    annotations = json.loads(bundled_val_run.annotations.read_text())
    folder = row["path"].rsplit("/", 2)[1]
    for image in annotations["images"]:
        image["file_name"] = f"{folder}/{image['file_name']}"
    with_folder = tmp_path / "with folder.json"
    with_folder.write_text(json.dumps(annotations))
    report = evaluate_output(out, with_folder, groups=ROAD_GROUPS)
    alone = evaluate_output(bundled_val_run.output, bundled_val_run.annotations, groups=ROAD_GROUPS)
    assert report["overall"] == alone["overall"] and report["images"] == 40
