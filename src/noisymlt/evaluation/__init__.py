"""Scoring a finished run: average precision (metrics) and the evaluate step. The inference-time table is
noisymlt.report.inference_time."""
