"""`python -m sirius_train.verl_backend.main_ppo OVERRIDES`: verl's `main_ppo`, with the entropy gate registered
in its TaskRunner only.

Why an entry point and not `VERL_USE_EXTERNAL_MODULES`: that variable makes `import verl` import the module in
every process of the job -- vLLM servers, reward workers, actor workers -- and `entropy.py` brings verl's V1
trainer stack with it. The trainer class is looked up in one process, the TaskRunner
(`get_trainer_cls(trainer.v1.trainer_mode)` in `TaskRunnerV1.run`), so only that process imports `entropy`.
`run_ppo(config, task_runner_class)` is verl's own hook for changing the TaskRunner; everything else is
verl's `main` as it is.
"""

from __future__ import annotations

import hydra
import ray
from verl.trainer.main_ppo import TaskRunnerV1, run_ppo
from verl.trainer.ppo.utils import need_critic, need_reference_policy
from verl.utils.config import validate_config
from verl.utils.device import auto_set_device


class _GatedTaskRunner(TaskRunnerV1.__ray_actor_class__):
    """verl's V1 TaskRunner that registers the `sirius_dapo` trainer when it starts (in its own process)."""

    def __init__(self):
        import sirius_train.verl_backend.entropy  # noqa: F401 -- registers the trainer in verl's registry

        super().__init__()


GatedTaskRunner = ray.remote(_GatedTaskRunner)  # as verl declares TaskRunnerV1


@hydra.main(config_path="pkg://verl.trainer.config", config_name="ppo_trainer", version_base=None)
def main(config) -> None:
    auto_set_device(config)
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    run_ppo(config, task_runner_class=GatedTaskRunner)


if __name__ == "__main__":
    # Run the importable copy, so Ray pickles the TaskRunner class by reference, not by value from __main__.
    from sirius_train.verl_backend.main_ppo import main as _main

    _main()
