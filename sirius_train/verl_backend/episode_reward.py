"""verl's reward function for multi-turn stages: `rewards/verl_reward.py`'s execution reward, the answer read from
the model's own turns (`data_synthesis.interaction.episode_answer`), never from an observation between them.

verl decodes the whole response, observations included: `extract_sql` on that text would score SQL a probe's result
printed, or a block written after the final answer -- a reward channel the local backend's rule does not have.
Here, not in `rewards/`, because the episode format is data_synthesis's (imports flow rewards <- data_synthesis).
"""

from __future__ import annotations

from data_synthesis.interaction import episode_answer
from rewards import verl_reward


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> dict:
    return compute_score_batch([data_source], [solution_str], [ground_truth], [extra_info], **kwargs)[0]


def compute_score_batch(data_sources, solution_strs, ground_truths, extra_infos=None, **kwargs) -> list[dict]:
    return verl_reward.compute_score_batch(data_sources, solution_strs, ground_truths, extra_infos,
                                           read_answer=episode_answer, **kwargs)
