import pytest

from rewards.extract import extract_sql
from rewards.outcome import Status
from rewards.reward import RewardTable, execution_reward


@pytest.mark.parametrize("answer, expected", [
    ("```sql\nSELECT 1\n```", "SELECT 1"),
    ("```SQL SELECT 1```", "SELECT 1"),
    ("first ```sql\nSELECT 1\n``` then ```sql\nSELECT 2\n```", "SELECT 2"),
    ("```sql\nSELECT 1\n``` <answer>SELECT 3</answer>", "SELECT 3"),
    ("<answer>SELECT 3</answer> ```sql\nSELECT 4\n```", "SELECT 4"),
    ("<answer>\n```sql\nSELECT 5\n```\n</answer>", "SELECT 5"),
    ("<ANSWER> select a from t </ANSWER>", "select a from t"),
    ("```sql\nSELECT 1", None),  # truncated: the fence never closes
    ("```python\nprint(1)\n```", None),
    ("<answer>   </answer>", None),
    ("SELECT 1", None),
    ("", None),
])
def test_extract_sql(answer, expected):
    assert extract_sql(answer) == expected


def test_extract_sql_non_string():
    assert extract_sql(None) is None


def test_reward_table_defaults_and_custom():
    assert execution_reward(Status.OK, True) == 1.0
    assert execution_reward("empty", True) == 1.0  # empty gold, empty prediction
    assert execution_reward("ok", False) == 0.0
    assert execution_reward("error", False) == 0.0
    assert execution_reward("timeout", False) == 0.0
    assert execution_reward("rejected", False) == 0.0
    assert execution_reward(None, False) == -1.0
    table = RewardTable(correct=2.0, wrong=0.1, error=-0.2, timeout=-0.3, rejected=-0.4, format_failure=-5.0)
    got = [execution_reward(s, False, table) for s in ("ok", "empty", "error", "timeout", "rejected", None)]
    assert got == [0.1, 0.1, -0.2, -0.3, -0.4, -5.0]
    assert execution_reward("ok", True, table) == 2.0


def test_reward_unknown_status_raises():
    with pytest.raises(ValueError):
        execution_reward("exploded", False)
