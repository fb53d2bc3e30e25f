"""Take the SQL out of a model's answer.

The answer contract (shared by the prompt, training and inference): the SQL is in a ```sql fenced
block or in <answer>...</answer>. When an answer holds several, the *last* one wins -- models often
draft, criticise and then restate. No SQL found is a *format failure*, which the reward punishes
harder than a wrong query.
"""

from __future__ import annotations

import re

_FENCE = re.compile(r"```[ \t]*sql[ \t]*\r?\n?(.*?)```", re.IGNORECASE | re.DOTALL)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.IGNORECASE | re.DOTALL)


def extract_sql(answer: str) -> str | None:
    """The last fenced-SQL or <answer> block of `answer`, stripped; None when there is none.

    Example:
        >>> extract_sql("draft:\\n```sql\\nSELECT 1\\n```\\nfinal:\\n```sql\\nSELECT 2;\\n```")
        'SELECT 2;'
        >>> extract_sql("<answer>SELECT name FROM t</answer>")
        'SELECT name FROM t'
        >>> extract_sql("The answer is SELECT 1") is None
        True
    """
    if not isinstance(answer, str):
        return None
    spans = [(m.start(), m.group(1)) for m in _FENCE.finditer(answer)]
    spans += [(m.start(), m.group(1)) for m in _ANSWER.finditer(answer)]
    if not spans:
        return None
    sql = max(spans, key=lambda s: s[0])[1]
    # An <answer> may itself wrap a fence.
    inner = _FENCE.search(sql)
    if inner is not None:
        sql = inner.group(1)
    sql = sql.strip()
    return sql or None

