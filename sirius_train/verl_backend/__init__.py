"""The verl backend: the two-stage DAPO schedule on verl (Ray, FSDP, vLLM), for clusters.

translate (run config -> verl overrides, pure), compose (validation against verl's Hydra config),
entropy + gated_loss (the gated entropy bonus inside verl), main_ppo (verl's entry point, our TaskRunner),
launch (processes), backend (`VerlBackend`).
See docs/CLUSTER.md.
"""

from sirius_train.verl_backend.backend import VerlBackend, plan_run

__all__ = ["VerlBackend", "plan_run"]
