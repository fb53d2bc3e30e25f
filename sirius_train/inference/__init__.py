"""Inference side: complementary candidates, an execution-grounded lifecycle, hybrid selection.

question -> `candidates` (specialist + generalist, with provenance) -> `lifecycle` (pre-execution
`prefilter`, typed execution, typed repair: the model-free `operators` and the LLM `corrector`,
re-admission, recovery) -> `selector` (S_maj consensus, optional S_rm from the pairwise `judge`, margin
gate, `structure`-based reranker) -> answer, with a per-candidate trace of every step; `pipeline` wires
the stages for `sirius select` and `sirius infer`. The scoring math (`selector`, `structure`,
`operators`, `prefilter`, `resolve`) is pure; databases and models are reached only through
`lifecycle`, `candidates`, `corrector` and `judge`.
"""
