"""Report helpers for pipelines.report.render: output tables without Spark, overlays, plots, the HTML page."""
