"""verl's DAPO reward manager with the overlong length counted as the local rule counts it: over the model's own
tokens, against `max_new_tokens`.

verl's manager measures an answer by the attention mask over the response, which in a multi-turn episode holds the
observations too; its budget is then the whole response room (max_new_tokens + max_turns x observation tokens),
so shaping all but never applied. Single-turn, the two lengths are one. A run without a reward model scores each
episode inside verl's agent loop (`AgentLoopWorker._compute_score`), which sends no `response_mask` and an
attention mask of ones: `SqlAgentLoop` records the model's token count in its `extra_fields` (`MODEL_TOKENS`),
which reach the manager as `tool_extra_fields`. Loaded by verl's reward loop with
`reward.reward_manager.source=importlib` (`translate._reward_manager`).
"""

from __future__ import annotations

from verl.experimental.reward_loop.reward_manager.dapo import DAPORewardManager

from sirius_train.algorithms.dapo import overlong_penalty

MODEL_TOKENS = "sirius_model_tokens"  # `SqlAgentLoop`'s extra_fields key: the model's own tokens in the episode


class SiriusDAPORewardManager(DAPORewardManager):
    """verl's manager (the score, `acc` for dynamic sampling, its logging) with the overlong term replaced."""

    async def run_single(self, data) -> dict:
        result = await super().run_single(data)
        buffer = self.overlong_buffer_cfg
        if buffer is None or not buffer.enable:
            return result
        own = model_tokens(data[-1])
        info = result["reward_extra_info"]
        penalty = overlong_penalty(own, self.max_resp_len, buffer.len) * buffer.penalty_factor
        result["reward_score"] = result["reward_score"] - info["overlong_reward"] + penalty
        info["overlong_reward"], info["overlong"] = penalty, penalty < 0
        return result


def model_tokens(item) -> int:
    """The model's own tokens in one rollout: our agent loop's count (the streaming path sends no response_mask),
    else the response_mask (a batch scored after the rollout), else the response under the attention mask (a
    single-turn response is all the model's)."""
    recorded = (item.non_tensor_batch.get("tool_extra_fields") or {}).get(MODEL_TOKENS)
    if recorded is not None:
        return int(recorded)
    batch = item.batch
    return int((batch["response_mask"] if "response_mask" in batch.keys()
                else batch["attention_mask"][-batch["responses"].shape[-1]:]).sum())
