"""Inference side: complementary candidates, an execution-grounded lifecycle, hybrid selection.

question -> `candidates` (specialist + generalist, with provenance) -> `lifecycle` (pre-execution
`prefilter`, typed execution, typed repair incl. the model-free `operators`, re-admission, recovery)
-> `selector` (S_maj consensus, optional S_rm judge, margin gate, `structure`-based reranker) -> answer,
with a per-candidate trace of every step. The scoring math (`selector`, `structure`, `operators`,
`prefilter`) is pure; databases and models are reached only through `lifecycle` and `candidates`.
"""
