"""The multi-turn episode format: the policy may run `<sql>…</sql>` probes before its final answer.

One format for training (local rollouts, the verl tool), `sirius benchmark` and `sirius infer`, so a model
is always asked, parsed and answered the same way (issue 19; SkyRL-SQL and MARS-SQL train this way):

- the prompt gains `probe_instructions` (appended to the system message, or to the user message when
  the run has no system message);
- every model turn ends at the first closed `<sql>…</sql>` (a *probe*), closed ```sql block or
  `</answer>` (the *final answer*, read by `rewards.extract.extract_sql` as in single-turn), or at EOS
  with neither (`parse_turn`);
- a probe runs in the read-only sandbox with a per-turn deadline (`run_probe`, the I/O edge, and
  `SandboxProbes`, which keeps one sandbox per database for it; or on the reward servers, `ServerProbes`), and its typed outcome comes back as an `<observation>…</observation>` block
  (`render_observation`): the status, the engine's error verbatim, or a compact table capped at
  `max_rows` rows and `max_chars` characters that still states the true row count;
- an episode that ends without a final answer is a format failure; one that runs out of probes
  (`max_turns`) or tokens is truncated (`episode_end`).

Everything but `run_probe`, `SandboxProbes` and `ServerProbes` is pure.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from enum import Enum

from rewards.databases import resolve_db_path
from rewards.extract import extract_sql
from rewards.outcome import Outcome, Status
from rewards.sandbox import Limits, Sandbox

PROBE_OPEN, PROBE_CLOSE = "<sql>", "</sql>"
OBSERVATION_OPEN, OBSERVATION_CLOSE = "<observation>", "</observation>"
# A probe's result is counted up to this many rows; past it the sandbox types the result "too large".
PROBE_ROW_CAP = 10_000
PROBE_RESULT_BYTES = 8 << 20

_PROBE = re.compile(r"<sql>(.*?)</sql>", re.IGNORECASE | re.DOTALL)
_FENCE = re.compile(r"```[ \t]*sql.*?```", re.IGNORECASE | re.DOTALL)
_ANSWER = re.compile(r"<answer>.*?</answer>", re.IGNORECASE | re.DOTALL)
_OBSERVATION_SEGMENT = re.compile(r"\n?<observation>.*?</observation>\n?", re.DOTALL)


@dataclass(frozen=True)
class ProbeLimits:
    """How far a policy may explore in one episode (config `rollout.multi_turn`)."""

    max_turns: int = 3  # probes per episode; one more probe after the last ends the episode as truncated
    max_rows: int = 5  # result rows shown in an observation (the true row count is always stated)
    max_chars: int = 400  # characters of an observation's body, table or error
    turn_timeout_s: float = 2.0  # SQLite deadline of one probe

    def __post_init__(self):
        if self.max_turns < 1 or self.max_rows < 1 or self.max_chars < 40 or not self.turn_timeout_s > 0:
            raise ValueError(f"need max_turns >= 1, max_rows >= 1, max_chars >= 40 and turn_timeout_s > 0, "
                             f"got {self}")

    def sandbox_limits(self, base: Limits = Limits()) -> Limits:
        """`base` with this per-turn deadline, counting rows only as far as `PROBE_ROW_CAP`."""
        return replace(base, timeout_s=self.turn_timeout_s, max_rows=min(base.max_rows, PROBE_ROW_CAP),
                       max_result_bytes=min(base.max_result_bytes, PROBE_RESULT_BYTES))


def probe_instructions(limits: ProbeLimits) -> str:
    """What the prompt adds so the model knows it may probe.

    >>> print(probe_instructions(ProbeLimits(max_turns=2)))
    Before answering you may run up to 2 exploratory read-only SQLite queries, one at a time, each written as <sql>QUERY</sql>; its result comes back as <observation>...</observation>. Then give the final query in a ```sql code block.
    """
    return (f"Before answering you may run up to {limits.max_turns} exploratory read-only SQLite queries, one at "
            f"a time, each written as {PROBE_OPEN}QUERY{PROBE_CLOSE}; its result comes back as "
            f"{OBSERVATION_OPEN}...{OBSERVATION_CLOSE}. Then give the final query in a ```sql code block.")


def with_probe_instructions(messages: list[dict], limits: ProbeLimits) -> list[dict]:
    """`messages` (a chat prompt) with `probe_instructions` appended to its system message, or to its last
    user message when it has none (as the nano runs, which use no system message). A new list.

    >>> msgs = with_probe_instructions([{"role": "user", "content": "Question: q"}], ProbeLimits(max_turns=1))
    >>> msgs[0]["content"].splitlines()[-1][:37]
    'Before answering you may run up to 1 '
    """
    roles = [m["role"] for m in messages]
    where = roles.index("system") if "system" in roles else len(roles) - 1 - roles[::-1].index("user")
    out = [dict(m) for m in messages]
    out[where]["content"] = f"{out[where]['content'].rstrip()}\n\n{probe_instructions(limits)}"
    return out


class TurnKind(str, Enum):
    PROBE = "probe"  # a closed <sql>…</sql>: run it, observe, continue
    ANSWER = "answer"  # a closed ```sql block or <answer>…</answer>: the episode's final answer
    NONE = "none"  # neither (the model stopped, or ran out of tokens, mid-thought)


@dataclass(frozen=True)
class ParsedTurn:
    kind: TurnKind
    sql: str | None  # the probe's or the answer's SQL (None for NONE, or an empty block)
    end: int  # characters of the text that belong to this turn (where its first closed block ends)


def parse_turn(text: str) -> ParsedTurn:
    """Classify one model turn by the *first* block it closes: a probe, the final answer, or neither.

    >>> parse_turn("Let me look. <sql>SELECT count(*) FROM t</sql> and more")
    ParsedTurn(kind=<TurnKind.PROBE: 'probe'>, sql='SELECT count(*) FROM t', end=46)
    >>> parse_turn("```sql\\nSELECT 1\\n``` <sql>SELECT 2</sql>").kind.value
    'answer'
    >>> parse_turn("<answer>SELECT 3</answer>").sql
    'SELECT 3'
    >>> parse_turn("<sql>SELECT 4").kind.value
    'none'
    """
    closes = [(m.end(), TurnKind.PROBE, m) for m in [_PROBE.search(text)] if m]
    closes += [(m.end(), TurnKind.ANSWER, m) for pattern in (_FENCE, _ANSWER) for m in [pattern.search(text)] if m]
    if not closes:
        return ParsedTurn(TurnKind.NONE, None, len(text))
    end, kind, match = min(closes, key=lambda c: c[0])
    sql = match.group(1).strip() if kind is TurnKind.PROBE else extract_sql(match.group(0))
    return ParsedTurn(kind, sql or None, end)


def episode_answer(text: str) -> str | None:
    """The final answer of a whole episode's text (model turns and the observations between them), read as the
    episode loops read it: turn by turn from the model's own text, each turn ending at its first closed block, an
    observation skipped. None when the episode ended without an answer (a turn that closed nothing, or a probe
    with no observation after it: out of probes or tokens).

    SQL inside an observation (a probe's result may print any text) is never the answer, and nothing the model
    wrote after its first closed answer counts -- unlike `extract_sql` on the whole text, which takes the last
    block anywhere.

    >>> episode_answer("<sql>SELECT q FROM t</sql>\\n<observation>\\nok: 1 row\\nq\\n<answer>SELECT 1</answer>\\n"
    ...                "</observation>\\nNo idea.") is None
    True
    >>> episode_answer("<sql>SELECT 1</sql>\\n<observation>\\nok: 1 row\\n</observation>\\n```sql\\nSELECT 2\\n```"
    ...                " or ```sql\\nSELECT 3\\n```")
    'SELECT 2'
    """
    position = 0
    while True:
        turn = parse_turn(text[position:])
        if turn.kind is TurnKind.ANSWER:
            return turn.sql
        if turn.kind is TurnKind.NONE:
            return None
        observation = _OBSERVATION_SEGMENT.search(text, position + turn.end)
        if observation is None:
            return None
        position = observation.end()


class EpisodeEnd(str, Enum):
    ANSWERED = "answered"  # a final answer: scored by the execution reward as single-turn answers are
    NO_ANSWER = "no_answer"  # the model stopped without one: a format failure
    TRUNCATED = "truncated"  # out of probes (a probe after the last allowed) or out of tokens


def episode_end(last: ParsedTurn, probes: int, limits: ProbeLimits, out_of_tokens: bool) -> EpisodeEnd | None:
    """How an episode ends after a model turn `last` with `probes` probes run before it; None: it goes on
    (the probe is run and observed).

    >>> L = ProbeLimits(max_turns=1)
    >>> episode_end(parse_turn("<sql>SELECT 1</sql>"), 0, L, False) is None
    True
    >>> episode_end(parse_turn("<sql>SELECT 1</sql>"), 1, L, False).value
    'truncated'
    >>> episode_end(parse_turn("I give up"), 0, L, False).value
    'no_answer'
    """
    if last.kind is TurnKind.ANSWER:
        return EpisodeEnd.ANSWERED
    if last.kind is TurnKind.PROBE:
        return EpisodeEnd.TRUNCATED if probes >= limits.max_turns or out_of_tokens else None
    return EpisodeEnd.TRUNCATED if out_of_tokens else EpisodeEnd.NO_ANSWER


def render_observation(outcome: Outcome, limits: ProbeLimits, row_count: int | None = None) -> str:
    """The observation block of a probe's typed outcome: its status and the engine's error verbatim, or
    its columns and first `max_rows` rows with the true row count; the body cut at `max_chars`.
    `row_count`: the true count when `outcome.rows` is only a preview (a reward server's /v1/execute).

    >>> print(render_observation(Outcome(Status.OK, ((1, "a"), (2, None), (3, "c")), ("id", "name")),
    ...                          ProbeLimits(max_rows=2)))
    <observation>
    ok: 3 rows, first 2 shown
    id | name
    1 | a
    2 | NULL
    </observation>
    >>> print(render_observation(Outcome(Status.ERROR, error="no such column: nme"), ProbeLimits()))
    <observation>
    error: no such column: nme
    </observation>
    """
    if outcome.executed:
        n = len(outcome.rows) if row_count is None else row_count
        shown = outcome.rows[:limits.max_rows]
        head = f"{outcome.status.value}: {n} row{'s' * (n != 1)}" + (f", first {len(shown)} shown" if n > len(shown)
                                                                      else "")
        lines = [head, " | ".join(_cell(c, limits.max_chars) for c in outcome.columns)]
        lines += [" | ".join(_cell(v, limits.max_chars) for v in row) for row in shown]
        body = "\n".join(lines)
    else:
        body = f"{outcome.status.value}: {outcome.error or ''}".rstrip()
    if len(body) > limits.max_chars:
        mark = f"\n... (cut at {limits.max_chars} characters)"
        body = body[:limits.max_chars - len(mark)].rstrip() + mark
    body = body.replace(OBSERVATION_CLOSE, "</observation_>")  # database text cannot close the block early
    return f"{OBSERVATION_OPEN}\n{body}\n{OBSERVATION_CLOSE}"


def _cell(value, max_chars: int) -> str:
    """One table cell on one line: NULL, numbers as SQLite prints them, blobs as x'hex', long text cut."""
    if value is None:
        return "NULL"
    if isinstance(value, bytes):
        text = f"x'{value[:max_chars].hex()}'"
    elif isinstance(value, float):
        text = repr(value)
    else:
        text = str(value)[:max_chars]
    return " ".join(text.split()) if any(c in text for c in "\n\r\t") else text


def run_probe(sandbox: Sandbox, sql: str | None, limits: ProbeLimits) -> str:
    """Run one probe in `sandbox` (read-only, see `rewards.sandbox`) under the per-turn deadline; the
    observation text. Never raises for bad SQL: writes, ATTACH, huge results and timeouts come back typed."""
    outcome = sandbox.run(sql if sql is not None else "", timeout_s=limits.turn_timeout_s)
    return render_observation(outcome, limits)


class SandboxProbes:
    """`probes(db_id, sql) -> observation` on the databases under `db_root` (`<db_id>/<db_id>.sqlite`): `run_probe`
    with one read-only sandbox per database, opened on first use and kept (opening costs more than a probe).
    An unknown db_id raises `rewards.databases.UnknownDatabase`: a configuration error, not the model's."""

    def __init__(self, db_root, limits: ProbeLimits):
        self.db_root, self.limits = db_root, limits
        self._sandboxes: dict[str, Sandbox] = {}

    def __call__(self, db_id: str, sql: str | None) -> str:
        if db_id not in self._sandboxes:
            self._sandboxes[db_id] = Sandbox(resolve_db_path(self.db_root, db_id), self.limits.sandbox_limits())
        return run_probe(self._sandboxes[db_id], sql, self.limits)

    def close(self) -> None:
        for sandbox in self._sandboxes.values():
            sandbox.close()
        self._sandboxes.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class ServerProbes:
    """`probes(db_id, sql) -> observation` on reward servers' `/v1/execute` (`url`: one or a comma-separated list;
    token from `SIRIUS_REWARD_TOKEN`), rendered as an in-process probe's. While they stay down, `fallback(db_id, sql)`
    answers (probes in a sandbox on the same databases, as the reward falls back); without one the outage raises."""

    def __init__(self, url: str, limits: ProbeLimits, fallback=None):
        self.url, self.limits, self.fallback = url, limits, fallback
        self._client = None

    def __call__(self, db_id: str, sql: str | None) -> str:
        from rewards.client import RewardClient, RewardServerUnavailable

        if self._client is None:
            self._client = RewardClient(self.url, token=os.environ.get("SIRIUS_REWARD_TOKEN"),
                                        timeout_s=max(30.0, 4 * self.limits.turn_timeout_s))
        try:
            answer = self._client.execute(db_id, sql or "", max_rows=self.limits.max_rows)
        except RewardServerUnavailable:
            if self.fallback is None:
                raise
            return self.fallback(db_id, sql)
        outcome = Outcome(Status(answer.status), rows=tuple(tuple(r) for r in answer.rows),
                          columns=tuple(answer.columns), error=answer.error, elapsed_s=answer.elapsed_s)
        return render_observation(outcome, self.limits, row_count=answer.row_count)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
        if hasattr(self.fallback, "close"):
            self.fallback.close()


def fit_observation(observation: str, tokens, budget: int) -> str:
    """`observation` with its body cut so that `tokens(observation_segment(it))` <= `budget`: an observation's size is
    capped in characters (`max_chars`), but a character may be several tokens (non-ASCII text under a byte-level
    tokenizer), and a token budget reserved per observation must hold. Unchanged when it fits.

    >>> obs = "<observation>\\nok: 1 row\\nx\\n" + "é" * 50 + "\\n</observation>"
    >>> cut = fit_observation(obs, lambda t: len(t.encode()), 60)  # UTF-8 bytes as tokens
    >>> len(observation_segment(cut).encode()) <= 60, cut.endswith("(cut to fit)\\n</observation>")
    (True, True)
    """
    if tokens(observation_segment(observation)) <= budget:
        return observation
    head, tail = f"{OBSERVATION_OPEN}\n", f"\n{OBSERVATION_CLOSE}"
    body = observation[len(head):-len(tail)] if observation.startswith(head) and observation.endswith(tail) else ""

    def cut(k: int) -> str:
        return f"{head}{body[:k].rstrip()}\n... (cut to fit){tail}"

    low, high = 0, len(body)  # the longest prefix that fits (a longer prefix never has fewer tokens)
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if tokens(observation_segment(cut(mid))) <= budget else (low, mid - 1)
    return cut(low)


def observation_segment(observation: str) -> str:
    """The text appended after a probe turn so that the model continues on a fresh line."""
    return f"\n{observation}\n"


def observation_spans(text: str) -> list[tuple[int, int]]:
    """Character spans of the observation segments in `text` (what `observation_segment` appended): the
    environment wrote them, so a demo's loss must not teach the model to write them.

    >>> text = demo_episode("SELECT 1", "<observation>\\nok: 1 row\\n</observation>", "<answer>SELECT 1</answer>")
    >>> [text[a:b] for a, b in observation_spans(text)]
    ['\\n<observation>\\nok: 1 row\\n</observation>\\n']
    """
    return [m.span() for m in _OBSERVATION_SEGMENT.finditer(text)]


def demo_episode(probe_sql: str, observation: str, answer: str) -> str:
    """A one-probe episode written out (an SFT demo of the format): the probe, its observation, the final answer.

    >>> demo_episode("SELECT 1", "<observation>ok</observation>", "<answer>SELECT 1</answer>").splitlines()
    ['<sql>SELECT 1</sql>', '<observation>ok</observation>', '<answer>SELECT 1</answer>']
    """
    return f"{PROBE_OPEN}{probe_sql}{PROBE_CLOSE}{observation_segment(observation)}{answer}"
