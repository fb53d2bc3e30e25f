"""The execution reward: (how the prediction ran, whether it matched) -> a number.

Pure and table-driven so that a run's reward scheme is one small, logged, configurable record.
DAPO's overlong shaping is added on top by the trainer (`sirius_train.algorithms.dapo`), not here:
it depends on the token length, which only the trainer knows.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from rewards.outcome import Status


@dataclass(frozen=True)
class RewardTable:
    """Reward per case. Defaults follow SPEC section 1."""

    correct: float = 1.0
    wrong: float = 0.0  # executed (ok/empty) but the result differs from gold
    error: float = 0.0  # the engine raised
    timeout: float = 0.0
    rejected: float = 0.0  # not one read-only statement, too large, ...
    format_failure: float = -1.0  # no SQL block in the answer
    # a match of two empty results ([] == []): None pays `correct`; a lower value stops paying full reward to
    # any query that returns nothing where gold is empty too
    empty_match: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def execution_reward(pred_status: Status | str | None, match: bool, table: RewardTable = RewardTable()) -> float:
    """Reward of one answer. `pred_status=None` means no SQL could be extracted (format failure).

    Example:
        >>> execution_reward("ok", True), execution_reward("empty", False), execution_reward(None, False)
        (1.0, 0.0, -1.0)
        >>> execution_reward("empty", True), execution_reward("empty", True, RewardTable(empty_match=0.0))
        (1.0, 0.0)
    """
    if pred_status is None:
        return table.format_failure
    status = Status(pred_status)
    if match:
        return table.empty_match if status is Status.EMPTY and table.empty_match is not None else table.correct
    if status.executed:
        return table.wrong
    return {Status.ERROR: table.error, Status.TIMEOUT: table.timeout, Status.REJECTED: table.rejected}[status]
