"""Report helpers for pipelines.render: output tables without Spark, overlays, plots, the HTML page."""
