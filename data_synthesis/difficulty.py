"""Difficulty under a policy (SPEC 2.3): sample k answers per example, score each by execution, p = correct / k.

The prompt is the one training uses: `PromptFormat.render(question, db, evidence)` with the run's format.
Answers are scored with the execution reward (`rewards`: extract the SQL, run it sandboxed, compare with
the gold result), so "correct" here means exactly what the trainer will reward.

Estimation is the slow step of building a curriculum (k generations per example), so it is resumable: every
finished chunk of examples is appended to a JSONL cache and fsynced; a run that is killed at any point
restarts where it stopped and reuses every finished line. Chunks are fixed slices of the example list, each
sampled with its own seed (`seed + first index`), so a resumed run produces exactly the rates an
uninterrupted one would. A cache line is keyed by a hash of everything that decides its result (prompt,
gold SQL, k, sampling parameters, seed, compare mode, and the caller's `policy` tag): change any of them and
the line is recomputed. Keep one cache per policy (or pass a `policy` tag that names the checkpoint).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from data_synthesis.interaction import episode_answer
from data_synthesis.prompts import PromptFormat
from data_synthesis.records import Example, check_unique_ids
from data_synthesis.samplers import Sampler
from rewards.databases import UnknownDatabase, resolve_db_path
from rewards.executor import Executor
from rewards.suites import Suite
from rewards.extract import extract_sql
from rewards.sandbox import Limits
from rewards.scoring import ScoreItem


class CacheError(ValueError):
    """The estimation cache file is damaged in a way resuming cannot repair."""


@dataclass(frozen=True)
class Estimate:
    """One example's pass rate and how its k answers ended."""

    id: str
    key: str
    k: int
    correct: int
    statuses: dict  # prediction status -> count ("ok", "empty", "error", "timeout", "rejected")
    format_failures: int
    gold_status: str

    @property
    def pass_rate(self) -> float:
        return self.correct / self.k

    def to_json(self) -> dict:
        return {"id": self.id, "key": self.key, "k": self.k, "correct": self.correct, "pass_rate": self.pass_rate,
                "statuses": self.statuses, "format_failures": self.format_failures, "gold_status": self.gold_status}


def prompt_for(example: Example, db_root: str | Path, prompt_format: PromptFormat = PromptFormat()) -> list[dict]:
    """The chat prompt of an example: the same one the trainer's rollouts use."""
    return prompt_format.render(example.question, resolve_db_path(db_root, example.db_id), example.evidence or None,
                                db_id=example.db_id)


def estimate_pass_rates(examples: Sequence[Example], sampler: Sampler, db_root: str | Path, k: int = 8,
                        **options) -> dict[str, float]:
    """Pass rate of every example whose gold SQL executes, as `{id: correct / k}`.

    Takes the keyword options of `estimate` (`cache_path`, `temperature`, `top_p`, `max_new_tokens`, `seed`,
    `batch_size`, `compare`, `timeout_s`, `workers`, `policy`, `progress`, `prompt_format`); examples whose gold SQL does not
    execute get no rate (validate the pool first: `data_synthesis.validate`).
    """
    return {e.id: e.pass_rate for e in estimate(examples, sampler, db_root, k, **options)
            if e.gold_status in ("ok", "empty")}


def estimate(examples: Sequence[Example], sampler: Sampler, db_root: str | Path, k: int = 8, *,
             cache_path: str | Path | None = None, temperature: float = 1.0, top_p: float = 1.0,
             max_new_tokens: int = 512, seed: int = 0, batch_size: int = 8, compare: str = "bird",
             timeout_s: float = 5.0, workers: int = 0, policy: str = "",
             progress: Callable[[int], None] | None = None,
             prompt_format: PromptFormat | None = None, variants: int = 0) -> list[Estimate]:
    """One `Estimate` per example (in input order): k answers sampled, scored by execution, cached.

    Args:
        examples: the pool (ids must be unique).
        sampler: any `Sampler` (`HFSampler`, `OpenAISampler`, ...).
        db_root: folder with `<db_id>/<db_id>.sqlite`.
        k: answers sampled per example.
        cache_path: append-only JSONL of finished examples; a rerun resumes from it (None: no cache).
        batch_size: examples per sampler call (each call generates `batch_size * k` answers).
        compare: result equivalence, "bird" or "spider" (as in the reward).
        workers: sandboxed executor processes for scoring (0: in this process).
        policy: a tag that names the policy in the cache key (e.g. a checkpoint path and step).
        progress: called with the number of examples finished (cached ones included).
        prompt_format: how prompts are rendered (the run's; it is part of the cache key via the prompt);
            None: the format of the sampler's model card (`sampler.prompt_format`), else the default.
        variants: a match must also hold on K variant databases, as the reward with `reward.variants: K` asks.
    """
    if k < 1 or batch_size < 1:
        raise ValueError(f"k and batch_size must be >= 1, got k={k}, batch_size={batch_size}")
    examples = list(examples)
    check_unique_ids(examples, "estimation input")
    missing = sorted({e.db_id for e in examples if not _has_db(db_root, e.db_id)})
    if missing:
        raise UnknownDatabase(f"no database under {db_root} for db_id(s) {missing[:5]}: every example needs "
                              f"{db_root}/<db_id>/<db_id>.sqlite (check --db-root)")
    prompt_format = prompt_format or getattr(sampler, "prompt_format", None) or PromptFormat()
    params = {"k": k, "temperature": temperature, "top_p": top_p, "max_new_tokens": max_new_tokens, "seed": seed,
              "compare": compare, "policy": policy}
    if variants:  # keyed apart; estimates without variants keep their keys
        params["variants"] = variants
    episodes = getattr(sampler, "multi_turn", False)  # an EpisodeSampler: each prompt probes its own database
    if episodes:  # keyed apart from single-turn estimates; single-turn keys stay as they were
        # "answer": read from the model's own turns (`episode_answer`); rates read off the whole text are not reused
        params["multi_turn"] = {**dataclasses.asdict(sampler.limits), "answer": "model turns"}
    prompts = [prompt_for(e, db_root, prompt_format) for e in examples]
    keys = [_key(p, e, params) for p, e in zip(prompts, examples)]
    cache = _Cache(Path(cache_path)) if cache_path is not None else None
    done: dict[str, Estimate] = cache.load() if cache else {}
    advance = progress or (lambda n: None)
    results: dict[str, Estimate] = {}
    with Executor(db_root, workers=workers, limits=Limits(timeout_s=timeout_s),
                  suite=Suite(variants=variants)) as executor:
        for start in range(0, len(examples), batch_size):
            chunk = range(start, min(start + batch_size, len(examples)))
            cached = [done.get(keys[i]) for i in chunk]
            if all(c is not None for c in cached):
                for i, c in zip(chunk, cached):
                    results[keys[i]] = c
                advance(len(chunk))
                continue
            # The whole chunk is sampled with its own seed even if part of it is cached, so every answer
            # is the one an uninterrupted run would have drawn.
            db_ids = {"db_ids": [examples[i].db_id for i in chunk]} if episodes else {}
            answers = sampler.sample([prompts[i] for i in chunk], k, temperature=temperature, top_p=top_p,
                                     max_new_tokens=max_new_tokens, seed=seed + start, **db_ids)
            fresh = _score(executor, [examples[i] for i in chunk], [keys[i] for i in chunk], answers, compare,
                           episode_answer if episodes else extract_sql)
            new = [f for f, c in zip(fresh, cached) if c is None]
            if cache:
                cache.append(new)
            for i, f, c in zip(chunk, fresh, cached):
                results[keys[i]] = c or f
            advance(len(chunk))
    if cache:
        cache.close()
    return [results[key] for key in keys]


def _has_db(db_root, db_id: str) -> bool:
    try:
        resolve_db_path(db_root, db_id)
    except UnknownDatabase:
        return False
    return True


def _key(prompt: list[dict], example: Example, params: dict) -> str:
    blob = json.dumps({"prompt": prompt, "gold": example.gold_sql, "db_id": example.db_id, **params},
                      sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def _score(executor: Executor, examples: list[Example], keys: list[str], answers: list[list[str]],
           compare: str, read_answer=extract_sql) -> list[Estimate]:
    """`read_answer(text)`: the SQL of one answer text (an episode's is read from the model's own turns)."""
    if len(answers) != len(examples) or any(len(a) != len(answers[0]) for a in answers):
        raise RuntimeError(f"sampler returned {[len(a) for a in answers]} answers for {len(examples)} prompts")
    items = [ScoreItem(db_id=e.db_id, gold_sql=e.gold_sql, pred_sql=read_answer(text), compare=compare, id=(i, j))
             for i, (e, texts) in enumerate(zip(examples, answers)) for j, text in enumerate(texts)]
    scored = executor.score(items)
    out = []
    for i, (e, key, texts) in enumerate(zip(examples, keys, answers)):
        mine = scored[i * len(texts):(i + 1) * len(texts)]
        statuses = Counter(r.pred_status for r in mine if r.format_ok)
        out.append(Estimate(e.id, key, len(texts), sum(r.match for r in mine), dict(statuses),
                            sum(not r.format_ok for r in mine), mine[0].gold_status))
    return out


class _Cache:
    """Append-only JSONL of finished estimates; a torn last line (a kill mid-write) is cut off on open."""

    def __init__(self, path: Path):
        self.path = path
        self._file = None

    def load(self) -> dict[str, Estimate]:
        done: dict[str, Estimate] = {}
        if not self.path.exists():
            return done
        data = self.path.read_bytes()
        complete = data[:data.rfind(b"\n") + 1]
        for lineno, line in enumerate(complete.decode("utf-8", "replace").splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                est = Estimate(row["id"], row["key"], row["k"], row["correct"], row["statuses"],
                               row["format_failures"], row["gold_status"])
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise CacheError(f"{self.path}:{lineno}: not an estimate line ({e}); delete that line (or the "
                                 "file, to estimate everything again)") from None
            done[est.key] = est
        if len(complete) != len(data):  # a torn tail: drop it so the next append starts on a fresh line
            with self.path.open("r+b") as f:
                f.truncate(len(complete))
        return done

    def append(self, estimates: list[Estimate]) -> None:
        if not estimates:
            return
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("a", encoding="utf-8")
        self._file.write("".join(json.dumps(e.to_json(), ensure_ascii=False) + "\n" for e in estimates))
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
