"""Scoring a finished run: average precision (metrics), the evaluate step and the inference-time table."""
