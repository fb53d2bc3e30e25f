"""verl's DAPO reward manager with the overlong length counted as the local rule counts it: over the model's own
tokens (`response_mask`), against `max_new_tokens`.

verl's manager measures an answer by the attention mask over the response, which in a multi-turn episode holds the
observations too; its budget is then the whole response room (max_new_tokens + max_turns x observation tokens),
so shaping all but never applied. Single-turn, the two lengths are one. Loaded by verl's reward loop with
`reward.reward_manager.source=importlib` (`translate._reward_manager`).
"""

from __future__ import annotations

from verl.experimental.reward_loop.reward_manager.dapo import DAPORewardManager

from sirius_train.algorithms.dapo import overlong_penalty


class SiriusDAPORewardManager(DAPORewardManager):
    """verl's manager (the score, `acc` for dynamic sampling, its logging) with the overlong term replaced."""

    async def run_single(self, data) -> dict:
        result = await super().run_single(data)
        buffer = self.overlong_buffer_cfg
        if buffer is None or not buffer.enable:
            return result
        item = data[-1]
        batch = item.batch
        own = int((batch["response_mask"] if "response_mask" in batch.keys()
                   else batch["attention_mask"][-batch["responses"].shape[-1]:]).sum())
        info = result["reward_extra_info"]
        penalty = overlong_penalty(own, self.max_resp_len, buffer.len) * buffer.penalty_factor
        result["reward_score"] = result["reward_score"] - info["overlong_reward"] + penalty
        info["overlong_reward"], info["overlong"] = penalty, penalty < 0
        return result
