"""Evaluation: EX reports in our / BIRD / Spider formats (`reports`), Spider's hardness buckets (`hardness`),
the official metrics (`official_metrics`: pure arithmetic; `official_eval`: their execution and timing), and
`sirius benchmark` (`benchmark`) with its figures (`figures`).

Imports flow one way: `benchmark` -> `reports`, `figures`, `official_metrics`, `hardness`; training-time
evaluation (`local/evaluate.py`) uses `figures` alone, never the benchmark. Nothing is imported here, so a light
command that reads one module pulls in nothing else.
"""
