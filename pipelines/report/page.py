"""report.html: one static page (no server, no external resources) plus the images beside it: the run summary,
per-class counts and score histograms, the evaluation (when OUT/evaluation.json exists), the errors table and a
gallery of overlay thumbnails (top-scoring images first) with a class filter in a few lines of inline JS.
"""

from __future__ import annotations

import datetime as dt
import json
from html import escape
from urllib.parse import quote

MAX_ERROR_ROWS = 500
STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em auto;max-width:1200px;padding:0 1em;color:#222}
img{max-width:100%}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ddd;padding:3px 8px;text-align:left}
td.n{text-align:right;font-variant-numeric:tabular-nums}.note{background:#fff4d6;border:1px solid #e0b400;
padding:.6em 1em;margin:1em 0}.muted{color:#777}#gallery{display:flex;flex-wrap:wrap;gap:10px}
#gallery figure{margin:0;width:260px;border:1px solid #ddd;padding:4px}#gallery img{width:100%;display:block}
#gallery figcaption{font-size:12px;word-break:break-all}#filters button{margin:0 4px 4px 0}
#filters button.on{background:#1f6fb4;color:#fff}
"""
SCRIPT = """
function filterGallery(name) {
  let shown = 0;
  document.querySelectorAll('#gallery figure').forEach(function (fig) {
    const keep = !name || JSON.parse(fig.dataset.classes).includes(name);
    fig.hidden = !keep; if (keep) shown++;
  });
  document.querySelectorAll('#filters button').forEach(function (b) {
    b.classList.toggle('on', b.dataset.name === name);
  });
  document.getElementById('shown').textContent = shown;
}
"""


def _table(header: list[str], rows: list[list], numeric: set[int] = frozenset()) -> str:
    head = "".join(f"<th>{escape(str(h))}</th>" for h in header)
    body = "".join(
        "<tr>"
        + "".join(f"<td{' class=n' if i in numeric else ''}>{escape(str(v))}</td>" for i, v in enumerate(row))
        + "</tr>"
        for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _fmt(value) -> str:
    return f"{value:.3f}" if isinstance(value, float) else ("" if value is None else str(value))


def summary_section(summary: dict | None) -> str:
    if not summary:
        return "<p class=muted>No summary.json in this output (the job did not finish a run here).</p>"
    model, counts = summary.get("model", {}), summary.get("counts", {})
    runtime = summary.get("runtime", {})
    parts = []
    if model.get("note"):
        parts.append(f"<div class=note><b>About this model:</b> {escape(model['note'])}</div>")
    classes = ", ".join(model.get("classes") or [])
    parts.append(
        _table(
            ["", ""],
            [
                ["run", summary.get("run_id")],
                ["input", summary.get("input")],
                ["output", summary.get("output")],
                [
                    "model",
                    f"{model.get('name')} ({str(model.get('sha256', ''))[:12]})" + (f": {classes}" if classes else ""),
                ],
                ["engine / precision", f"{summary.get('engine')} / {runtime.get('precision')}"],
                [
                    "images",
                    f"{counts.get('inputs')} inputs: {counts.get('done')} done, {counts.get('failed')} failed, "
                    f"{counts.get('skipped')} skipped (already done for this model)",
                ],
                ["instances", counts.get("instances")],
                [
                    "speed",
                    f"{summary.get('images_per_second')} images/s over {summary.get('wall_seconds')} s, "
                    f"{summary.get('partitions')} partitions",
                ],
                ["output holds", json.dumps(summary.get("table"))],
            ],
        )
    )
    stages = summary.get("stage_seconds") or {}
    total = sum(stages.values()) or 1.0
    parts.append("<h3>Stage split (task seconds, summed over tasks)</h3>")
    parts.append(
        _table(
            ["stage", "seconds", "share"],
            [[k, f"{v:.3f}", f"{100 * v / total:.1f}%"] for k, v in stages.items()],
            {1, 2},
        )
    )
    return "\n".join(parts)


def classes_section(counts: dict[str, tuple[int, int, int]], threshold: float, plots: list[str]) -> str:
    """counts: class -> (instances >= threshold, all instances, images with one >= threshold)."""
    if not counts:
        return "<p class=muted>No instances.</p>"
    rows = [[name, above, total, images] for name, (above, total, images) in counts.items()]
    imgs = "".join(f'<p><img src="{quote(p)}" alt="{escape(p)}"></p>' for p in plots)
    if not plots:
        imgs = "<p class=muted>No plots: matplotlib is not installed (pip install 'sparkseg[report]').</p>"
    return (
        _table(
            ["class", f"instances score >= {threshold:g}", "all instances", f"images with one >= {threshold:g}"],
            rows,
            {1, 2, 3},
        )
        + imgs
    )


def _overall_table(overall: dict) -> str:
    """{box,mask}_{ap,ap50,ap75}[_group] -> one row per class group, one column per metric."""
    rows: dict[str, dict] = {}
    for key, value in overall.items():
        prefix, _, rest = key.partition("_")
        metric, _, group = rest.partition("_")
        rows.setdefault(group or "all classes", {})[f"{prefix} {metric.upper()}"] = value
    columns = list(dict.fromkeys(c for row in rows.values() for c in row))
    return _table(
        ["classes"] + columns,
        [[name] + [_fmt(row.get(c)) for c in columns] for name, row in rows.items()],
        set(range(1, len(columns) + 1)),
    )


def evaluation_section(evaluation: dict | None) -> str:
    if not evaluation:
        return (
            "<p class=muted>Not evaluated. With COCO annotations of (some of) the input images: "
            "<code>python -m pipelines.report.evaluate --output OUT --annotations COCO.json</code></p>"
        )
    overall = evaluation.get("overall", {})
    parts = [
        f"<p>{evaluation.get('images')} annotated images of <code>{escape(str(evaluation.get('annotations')))}"
        f"</code>, {evaluation.get('results')} detections (COCO AP@[.5:.95] with pycocotools).</p>",
        _overall_table(overall),
    ]
    if evaluation.get("images_not_in_output_count"):
        parts.append(
            f"<p class=muted>{evaluation['images_not_in_output_count']} annotated images are not in this "
            "output and were left out.</p>"
        )
    threshold = evaluation.get("score_threshold")
    header = [
        "class",
        "box AP",
        "mask AP",
        "ground truth",
        f"detections >= {threshold}",
        "found (IoU >= 0.5)",
        "recall",
    ]
    rows = [
        [
            name,
            _fmt(e.get("box_ap")),
            _fmt(e.get("mask_ap")),
            e["ground_truth"],
            e["detections"],
            e["found"],
            _fmt(e.get("recall")),
        ]
        for name, e in evaluation.get("per_class", {}).items()
    ]
    parts.append(_table(header, rows, set(range(1, 7))))
    return "\n".join(parts)


def errors_section(errors: list[dict], total: int) -> str:
    """errors: the first rows (by path) of `total` current error rows."""
    if not total:
        return "<p>No failed images.</p>"
    rows = [
        [e.get("path"), e.get("stage"), e.get("error_type"), (e.get("message") or "")[:400]]
        for e in errors[:MAX_ERROR_ROWS]
    ]
    extra = total - len(rows)
    more = f"<p class=muted>and {extra} more in errors/.</p>" if extra > 0 else ""
    return f"<p>{total} failed images:</p>" + _table(["path", "stage", "error", "message"], rows) + more


def gallery_section(index: dict | None) -> str:
    if not index or not index.get("images"):
        return "<p class=muted>No overlays (python -m pipelines.report.render --output OUT draws them).</p>"
    entries = index["images"]
    classes = sorted({c for e in entries for c in e["classes"]})
    buttons = "".join(
        f'<button type=button data-name="{escape(c)}" onclick="filterGallery(this.dataset.name)">{escape(c)}</button>'
        for c in classes
    )
    figures = []
    for e in entries:
        caption = f"{e['name']}: " + (
            f"top {e['top_score']:.2f}, {e['drawn']} shown" if e["drawn"] else "nothing above the threshold"
        )
        figures.append(
            f'<figure data-classes="{escape(json.dumps(e["classes"]))}" data-score="{e["top_score"]:.4f}">'
            f'<a href="{quote(e["overlay"])}"><img src="{quote(e["thumbnail"])}" alt="{escape(e["name"])}">'
            f"</a><figcaption>{escape(caption)}</figcaption></figure>"
        )
    missing = index.get("missing") or []
    note = (
        f"<p class=muted>{len(missing)} images could not be drawn (source not found), e.g. "
        f"{escape(missing[0]['path'])}: pass --input-root DIR.</p>"
        if missing
        else ""
    )
    return (
        f"<p>{len(entries)} of {index.get('images_total')} images, top-scoring first; instances with score >= "
        f"{index['score_threshold']:g}. Showing <span id=shown>{len(entries)}</span>.</p>"
        f'<div id=filters><button type=button data-name="" class=on onclick="filterGallery(\'\')">all</button>'
        f"{buttons}</div>{note}<div id=gallery>{''.join(figures)}</div>"
    )


def report_html(
    summary: dict | None,
    counts: dict,
    threshold: float,
    plots: list[str],
    evaluation: dict | None,
    errors: list[dict],
    errors_total: int,
    index: dict | None,
) -> str:
    when = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    title = f"sparkseg report: {summary.get('run_id') if summary else 'output'}"
    return f"""<!DOCTYPE html>
<html lang=en><head><meta charset=utf-8><title>{escape(title)}</title><style>{STYLE}</style></head><body>
<h1>{escape(title)}</h1><p class=muted>written {when} by python -m pipelines.report.render</p>
<h2 id=summary>Run summary</h2>{summary_section(summary)}
<h2 id=classes>Classes</h2>{classes_section(counts, threshold, plots)}
<h2 id=evaluation>Evaluation against ground truth</h2>{evaluation_section(evaluation)}
<h2 id=errors>Errors</h2>{errors_section(errors, errors_total)}
<h2 id=overlays>Overlays</h2>{gallery_section(index)}
<script>{SCRIPT}</script></body></html>
"""
