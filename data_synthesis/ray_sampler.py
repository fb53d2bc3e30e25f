"""Pass-rate estimation across a Ray cluster: one sampler actor per GPU, one cache, the same rates.

`distributed_estimate` is `difficulty.estimate` with its generation fanned out. `estimate` cuts the pool into
fixed chunks of `batch_size` examples and samples each with its own seed (`seed + first index`); here a pool
of Ray actors (each holding one sampler: `VLLMSampler` on its GPU, or `HFSampler`) generates those chunks
ahead of the driver, while the driver's `estimate` scores them in order and appends them to the same
resumable JSONL cache as a one-process run. A chunk's answers depend only on its prompts and its seed, so the
rates are exactly those of one process, and a killed run resumes from the cache like any other.

    from functools import partial
    ray.init(address="auto")                                   # or nothing: a local cluster
    rates = distributed_estimate(pool, partial(VLLMSampler, "ckpt/"), "dbs", k=8, actors=8, num_gpus=1,
                                 cache_path="runs/x/rates.cache.jsonl")
"""

from __future__ import annotations

import hashlib
import json
import signal
import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from data_synthesis.difficulty import Estimate, estimate, prompt_for
from data_synthesis.extras import require
from data_synthesis.prompts import PromptFormat
from data_synthesis.records import Example
from data_synthesis.samplers import Sampler

Call = tuple[list[list[dict]], int, dict]  # (prompts, n, sampling options incl. seed): one `Sampler.sample` call


KEPT_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)


def init_ray(ray, **options) -> None:
    """`ray.init(**options)`, keeping this process's own SIGTERM / SIGUSR1 / SIGINT handlers.

    Ray (2.60) installs its SIGTERM handler unconditionally, `sys.exit(signum)`: a preemption that arrives while
    Ray is up in the driver (pass rates, gap filling, a held-out evaluation on vLLM engines) would exit 15 with no
    checkpoint instead of stopping where the schedule's handler lets the run resume."""
    kept = {s: signal.getsignal(s) for s in KEPT_SIGNALS}
    ray.init(**options)
    if threading.current_thread() is threading.main_thread():
        for sig, handler in kept.items():
            if handler is not None:  # None: installed outside Python, nothing of ours to put back
                signal.signal(sig, handler)


class _SamplerActor:
    """Holds one sampler (one engine, one GPU) for the life of the pool."""

    def __init__(self, make_sampler: Callable[[], Sampler]):
        self.sampler, self.error = None, None
        try:
            self.sampler = make_sampler()
        except Exception as e:  # kept for `ready`: an actor that dies in __init__ leaves only Ray's text of it
            self.error = e

    def ready(self) -> bool:
        if self.error is not None:
            raise self.error
        return True

    def sample(self, prompts: list[list[dict]], n: int, options: dict) -> list[list[str]]:
        return self.sampler.sample(prompts, n, **options)


class RaySampler:
    """A `Sampler` whose calls run on a pool of Ray actors, each with its own sampler from `make_sampler`.

    Told the calls to come (`expect`), it submits them ahead of the caller -- up to `lookahead` beyond the one
    asked for, to whichever actor has the least queued -- so all actors generate while the caller works on
    the answers it already has. A call nobody announced runs on demand; the answers are the same either way.

    Args:
        make_sampler: picklable factory run once in each actor, e.g. `partial(VLLMSampler, path)`.
        actors: how many actors (engines) to start.
        num_gpus: GPUs each actor reserves (1, or the tensor-parallel size; 0 on CPU).
        num_cpus: CPUs each actor reserves.
        lookahead: calls submitted beyond the one asked for (default: 2 per actor).
        limits: the `interaction.ProbeLimits` of actors whose samplers answer in multi-turn episodes
            (`turns.TurnEpisodeSampler`): `sample` then takes the prompts' `db_ids`, and estimates are keyed apart.

    Ray is initialised if it is not already (`RAY_ADDRESS` or a new local cluster); that cluster is shut down
    on `close`, one the caller started is left running.
    """

    def __init__(self, make_sampler: Callable[[], Sampler], actors: int, *, num_gpus: float = 0.0,
                 num_cpus: float = 1.0, lookahead: int | None = None, limits=None):
        ray = require("ray", "ray", "the Ray fan-out of samplers", "sample in one process")
        if actors < 1:
            raise ValueError(f"actors={actors}: need at least one sampler actor")
        self._ray = ray
        self.multi_turn, self.limits = limits is not None, limits
        self._owns_ray = not ray.is_initialized()
        if self._owns_ray:
            init_ray(ray)
        _check_resources(ray.cluster_resources(), actors, num_gpus, num_cpus)
        actor_class = ray.remote(_SamplerActor).options(num_gpus=num_gpus, num_cpus=num_cpus)
        self._actors = [actor_class.remote(make_sampler) for _ in range(actors)]
        self.lookahead = 2 * actors if lookahead is None else lookahead
        self._queued = [0] * actors
        self._inflight: dict[str, tuple[object, int]] = {}  # call key -> (future, actor index)
        self._plan: list[tuple[str, Call]] = []
        self._position: dict[str, int] = {}
        self._submitted_through = 0
        self.stats = {"prefetched": 0, "on_demand": 0}
        try:
            ray.get([a.ready.remote() for a in self._actors])
        except Exception as e:
            self.close()
            _raise_actor_error(e)

    def expect(self, calls: Iterable[Call]) -> None:
        """Announce the calls to come, in the order they will be asked for."""
        self._plan = [(_call_key(*call), call) for call in calls]
        self._position = {key: i for i, (key, _) in enumerate(self._plan)}
        self._submitted_through = 0

    def sample(self, prompts, n, *, temperature=1.0, top_p=1.0, max_new_tokens=256, seed=None, db_ids=None):
        options = {"temperature": temperature, "top_p": top_p, "max_new_tokens": max_new_tokens, "seed": seed}
        if db_ids is not None:  # episodes: each prompt probes its own database
            options["db_ids"] = list(db_ids)
        key = _call_key(prompts, n, options)
        if key in self._position:
            self._prefetch(self._position[key])
        if key in self._inflight:
            self.stats["prefetched"] += 1
        else:
            self.stats["on_demand"] += 1
            self._submit(key, (prompts, n, options))
        future, actor = self._inflight.pop(key)
        try:
            answers = self._ray.get(future)
        except Exception as e:
            _raise_actor_error(e)
        finally:
            self._queued[actor] -= 1
        return answers

    def close(self) -> None:
        for actor in self._actors:
            self._ray.kill(actor)
        self._actors, self._inflight = [], {}
        if self._owns_ray:
            self._ray.shutdown()

    def __enter__(self) -> RaySampler:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _prefetch(self, position: int) -> None:
        # Calls before `position` that were never asked for were skipped by the caller (cached): not submitted.
        start = max(self._submitted_through, position)
        end = min(position + 1 + self.lookahead, len(self._plan))
        for key, call in self._plan[start:end]:
            if key not in self._inflight:
                self._submit(key, call)
        self._submitted_through = max(self._submitted_through, end)

    def _submit(self, key: str, call: Call) -> None:
        actor = min(range(len(self._actors)), key=self._queued.__getitem__)
        prompts, n, options = call
        self._inflight[key] = (self._actors[actor].sample.remote(prompts, n, options), actor)
        self._queued[actor] += 1


def distributed_estimate(examples: Sequence[Example], make_sampler: Callable[[], Sampler], db_root: str | Path,
                         k: int = 8, *, actors: int, num_gpus: float = 0.0, num_cpus: float = 1.0,
                         batch_size: int = 8, seed: int = 0, temperature: float = 1.0, top_p: float = 1.0,
                         max_new_tokens: int = 512, prompt_format: PromptFormat = PromptFormat(),
                         **options) -> list[Estimate]:
    """`difficulty.estimate` with generation spread over `actors` Ray actors; the same estimates and cache.

    `options` are `estimate`'s other keywords (`cache_path`, `compare`, `timeout_s`, `workers`, `policy`,
    `progress`). Scoring runs on the driver, so the driver needs the databases; actors need only the model.
    """
    prompts = [prompt_for(e, db_root, prompt_format) for e in examples]
    sampling = {"temperature": temperature, "top_p": top_p, "max_new_tokens": max_new_tokens}
    with RaySampler(make_sampler, actors, num_gpus=num_gpus, num_cpus=num_cpus) as sampler:
        sampler.expect(estimate_calls(prompts, k, batch_size=batch_size, seed=seed, **sampling))
        return estimate(examples, sampler, db_root, k, batch_size=batch_size, seed=seed, prompt_format=prompt_format,
                        **sampling, **options)


def estimate_calls(prompts: list[list[dict]], k: int, *, batch_size: int, seed: int, db_ids: list[str] | None = None,
                   **sampling) -> list[Call]:
    """The sampler calls `difficulty.estimate` makes, in order: fixed chunks, each seeded with its first index
    (with `db_ids`, each chunk's databases too: the calls of an episode sampler).

    Example:
        >>> prompts = [[{"role": "user", "content": q}] for q in "abcde"]
        >>> [(len(p), n, o["seed"]) for p, n, o in estimate_calls(prompts, 8, batch_size=2, seed=10, top_p=1.0)]
        [(2, 8, 10), (2, 8, 12), (1, 8, 14)]
    """
    return [(prompts[s:s + batch_size], k, {**sampling, "seed": seed + s,
                                            **({"db_ids": db_ids[s:s + batch_size]} if db_ids is not None else {})})
            for s in range(0, len(prompts), batch_size)]


def _call_key(prompts: list[list[dict]], n: int, options: dict) -> str:
    blob = json.dumps({"prompts": prompts, "n": n, **options}, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()


def _check_resources(available: dict, actors: int, num_gpus: float, num_cpus: float) -> None:
    """Fail at once, not hang: Ray would wait forever for actors the cluster cannot place."""
    for name, per_actor in (("GPU", num_gpus), ("CPU", num_cpus)):
        need, have = actors * per_actor, available.get(name, 0)
        if need > have:
            raise ValueError(f"{actors} actors x {per_actor:g} {name} = {need:g} {name}s, but the Ray cluster has "
                             f"{have:g}: lower --ray-actors (or the {name}s per actor), or add nodes")


def _raise_actor_error(error: Exception):
    """Re-raise the sampler's own error (e.g. `MissingExtra` on a node without vLLM), not Ray's wrapper."""
    cause = error
    while getattr(cause, "cause", None) is not None and cause.cause is not cause:
        cause = cause.cause
    if cause is not error and isinstance(cause, Exception):
        raise cause from None
    raise error
