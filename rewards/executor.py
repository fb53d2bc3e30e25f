"""Worker processes around the sandbox, with a hard stop that does not trust the query to cooperate.

`Executor(db_root, workers=N)` keeps N worker processes (`rewards._worker`), each with its own
connection and gold-result caches (`rewards.scoring.Scorer`). Callers -- any number of threads at
once, e.g. the reward server's request handlers -- submit batches; batches are split into chunks
grouped by (database, gold SQL) so that each worker's caches hit, and idle workers pull chunks from
one shared queue. Each worker publishes which item it is running in a small shared-memory record and
sends results back in batches, so the parent always knows which item is in flight at no IPC cost:

- an item that takes longer than its budget (the SQLite deadline, per statement, plus a grace) gets
  its worker SIGKILLed and replaced; the item comes back as TIMEOUT;
- a worker that dies (OOM killer, segfault, someone's `kill -9`) is replaced; the item it was running
  comes back as a typed ERROR, and the rest of its chunk is re-queued -- nothing is lost, nothing hangs.

Submission never blocks: `submit_score` / `submit_execute_many` return a `concurrent.futures.Future`
(an async caller wraps it with `asyncio.wrap_future`). Cancelling that future drops the batch's chunks
that have not started, so a client that gave up does not keep the workers busy.

`workers=0` runs a Scorer in the calling thread instead (no backstop; for tests and tiny jobs).
"""

from __future__ import annotations

import itertools
import mmap
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import asdict
from multiprocessing.connection import Connection
from pathlib import Path

from rewards.outcome import Outcome, Status
from rewards.reward import RewardTable
from rewards.sandbox import Limits
from rewards._worker import STATE
from rewards.scoring import ScoreItem, ScoreResult, Scorer

OnResult = Callable[[int, object], None]
POLL_S = 0.05  # how often an idle wait checks the backstop
STARTUP_TIMEOUT_S = 60.0
MAX_ATTEMPTS = 2  # re-sends of a chunk whose worker stalled before starting any item of it


class _Job:
    """One caller's batch: results by position, and the future the caller holds."""

    def __init__(self, n: int, on_result: OnResult):
        self.results: list = [None] * n
        self.remaining = n
        self.on_result = on_result
        self.lock = threading.Lock()
        self.future: Future = Future()
        if n == 0:
            self.future.set_result([])

    def set(self, index: int, result) -> None:
        with self.lock:
            if self.results[index] is not None:  # never answer an item twice
                return
            self.results[index] = result
            self.remaining -= 1
            finished = self.remaining == 0
        self.on_result(index, result)
        if finished:
            try:
                self.future.set_result(self.results)
            except InvalidStateError:  # the caller cancelled it meanwhile
                pass


class _WorkerProcess:
    def __init__(self, config: dict):
        parent_read, child_write = os.pipe()
        child_read, parent_write = os.pipe()
        self._state_file = tempfile.TemporaryFile()  # unlinked at once: nothing is left on disk
        self._state_file.truncate(STATE.size)
        self.state = mmap.mmap(self._state_file.fileno(), STATE.size)
        STATE.pack_into(self.state, 0, -1, -1, 0.0)
        env = dict(os.environ)
        env["PYTHONPATH"] = str(Path(__file__).resolve().parent.parent) + os.pathsep + env.get("PYTHONPATH", "")
        state_fd = self._state_file.fileno()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rewards._worker", str(child_read), str(child_write), str(state_fd)],
            pass_fds=(child_read, child_write, state_fd), env=env, stdin=subprocess.DEVNULL,
        )
        os.close(child_read)
        os.close(child_write)
        self.outbox = Connection(parent_write, readable=False)
        self.inbox = Connection(parent_read, writable=False)
        self.outbox.send(config)

    def wait_ready(self, timeout: float) -> None:
        """Block until the worker has imported and opened its caches; a worker that cannot start is loud."""
        if not self.inbox.poll(timeout) or self.inbox.recv() != "ready":
            code = self.kill()
            raise RuntimeError(f"executor worker failed to start within {timeout:.0f}s (exit code {code})")

    def running(self, seq: int) -> tuple[int, float]:
        """(index in chunk `seq` of the item being run, seconds it has run); (-1, 0) if none of it is running."""
        worker_seq, index, started = STATE.unpack_from(self.state, 0)
        if worker_seq != seq or index < 0:
            return -1, 0.0
        return index, time.monotonic() - started

    def kill(self) -> int | None:
        try:
            self.proc.kill()
        except ProcessLookupError:
            pass
        code = self.proc.wait()
        for handle in (self.outbox, self.inbox, self.state, self._state_file):
            handle.close()
        return code

    def stop(self, timeout: float = 5.0) -> None:
        try:
            self.outbox.send(None)
            self.proc.wait(timeout)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self.kill()


class Executor:
    """Score pairs or execute queries on a pool of sandboxed worker processes.

    Args:
        db_root: folder with `<db_id>/<db_id>.sqlite`.
        workers: worker processes (0 = run in the calling thread, no process backstop).
        limits: per-statement caps (timeout, rows, bytes, ...).
        table: reward table used to fill `ScoreResult.reward`.
        chunk_size: items sent to a worker at once (amortises IPC; a killed worker re-queues the rest).
        grace_s: slack added to the SQLite deadline before the process backstop fires.
        memory_limit_bytes: RLIMIT_AS of each worker process.
    """

    def __init__(self, db_root: str | Path, *, workers: int = 2, limits: Limits = Limits(),
                 table: RewardTable = RewardTable(), chunk_size: int = 32, grace_s: float = 0.5,
                 memory_limit_bytes: int | None = 4 << 30):
        if workers < 0:
            raise ValueError(f"workers must be >= 0, got {workers}")
        self.db_root = Path(db_root)
        if not self.db_root.is_dir():
            raise FileNotFoundError(f"database root is not a directory: {self.db_root}")
        self.limits, self.table = limits, table
        self.chunk_size = max(1, chunk_size)
        self.grace_s = grace_s
        self.restarts = 0
        self.outcomes: Counter = Counter()
        self._stats_lock = threading.Lock()
        self._config = {"db_root": str(self.db_root), "limits": limits, "table": table,
                        "memory_limit_bytes": memory_limit_bytes}
        self._queue: queue.Queue = queue.Queue()
        self._inflight = 0
        self._seqs = itertools.count(1)  # chunk numbers, so a worker's state record names the chunk it runs
        self._closed = False
        self._local: Scorer | None = None
        self._local_lock = threading.Lock()
        self._workers: list[_WorkerProcess] = []
        self._threads: list[threading.Thread] = []
        if workers == 0:
            self._local = Scorer(self.db_root, limits, table)
            return
        for slot in range(workers):
            self._workers.append(self._spawn())
            thread = threading.Thread(target=self._serve, args=(slot,), name=f"sirius-executor-{slot}", daemon=True)
            thread.start()
            self._threads.append(thread)

    # ------------------------------------------------------------------ public API
    def score(self, items: Sequence[ScoreItem], on_result: OnResult | None = None) -> list[ScoreResult]:
        """Score every item; results in input order. `on_result(i, result)` fires as each finishes."""
        return self.submit_score(items, on_result).result()

    def execute_many(self, queries: Sequence[tuple[str, str]], on_result: OnResult | None = None) -> list[Outcome]:
        """Run `(db_id, sql)` queries; outcomes in input order."""
        return self.submit_execute_many(queries, on_result).result()

    def submit_score(self, items: Sequence[ScoreItem], on_result: OnResult | None = None) -> Future:
        """Like `score`, without waiting: a future of the results (cancel it to drop what has not started)."""
        keys = [(it.db_id, it.gold_sql) for it in items]
        return self._submit("score", list(items), keys, on_result)

    def submit_execute_many(self, queries: Sequence[tuple[str, str]], on_result: OnResult | None = None) -> Future:
        """Like `execute_many`, without waiting: a future of the outcomes."""
        keys = [(db_id, "") for db_id, _ in queries]
        return self._submit("exec", [tuple(q) for q in queries], keys, on_result)

    def execute(self, db_id: str, sql: str) -> Outcome:
        return self.execute_many([(db_id, sql)])[0]

    @property
    def workers(self) -> int:
        return len(self._workers)

    def queue_depth(self) -> int:
        """Items submitted and not yet answered (queued or running)."""
        with self._stats_lock:
            return self._inflight

    def close(self) -> None:
        """Finish the work already submitted, then stop the workers. New submissions are refused."""
        if self._closed:
            return
        self._closed = True
        for _ in self._threads:
            self._queue.put(None)
        for thread in self._threads:
            thread.join(timeout=30)
        for worker in self._workers:
            worker.stop()
        if self._local is not None:
            self._local.close()
        self._fail_leftovers()

    def _fail_leftovers(self) -> None:
        """Answer chunks still queued after the dispatchers stopped (re-queued behind the stop marks)."""
        while True:
            try:
                task = self._queue.get_nowait()
            except queue.Empty:
                return
            if task is not None:
                job, kind, chunk, _ = task
                for index, payload in chunk:
                    job.set(index, self._failed(kind, payload, "executor closed before running it"))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ------------------------------------------------------------------ internals
    def _submit(self, kind: str, payloads: list, keys: list, on_result: OnResult | None) -> Future:
        if self._closed:
            raise RuntimeError("executor is closed")
        job = _Job(len(payloads), self._counting(on_result))
        with self._stats_lock:
            self._inflight += len(payloads)
        if self._local is not None:
            with self._local_lock:
                for i, payload in enumerate(payloads):
                    job.set(i, self._local.score(payload) if kind == "score" else self._local.execute(*payload))
            return job.future
        # Group by cache key so a chunk reuses one connection and one gold result.
        order = sorted(range(len(payloads)), key=lambda i: keys[i])
        for start in range(0, len(order), self.chunk_size):
            chunk = [(i, payloads[i]) for i in order[start:start + self.chunk_size]]
            self._queue.put((job, kind, chunk, 0))
        return job.future

    def _counting(self, on_result: OnResult | None) -> OnResult:
        def record(index: int, result) -> None:
            status = result.pred_status if isinstance(result, ScoreResult) else result.status.value
            with self._stats_lock:
                self._inflight -= 1
                self.outcomes[status] += 1
            if on_result is not None:
                on_result(index, result)
        return record

    def _spawn(self) -> _WorkerProcess:
        worker = _WorkerProcess(self._config)
        worker.wait_ready(STARTUP_TIMEOUT_S)
        return worker

    def _budget(self, kind: str) -> float:
        statements = 2 if kind == "score" else 1  # a score item may run its gold and its prediction
        return statements * (self.limits.timeout_s + self.grace_s)

    def _serve(self, slot: int) -> None:
        while True:
            task = self._queue.get()
            if task is None:
                return
            job, kind, chunk, attempt = task
            if job.future.cancelled():  # the caller gave up: skip what has not started
                with self._stats_lock:
                    self._inflight -= len(chunk)
                continue
            try:
                self._run_chunk(slot, job, kind, chunk, attempt)
            except Exception as e:  # never leave a caller waiting on a bug of ours
                for index, payload in chunk:
                    job.set(index, self._failed(kind, payload, f"executor error: {type(e).__name__}: {e}"))

    def _run_chunk(self, slot: int, job: _Job, kind: str, chunk: list, attempt: int) -> None:
        worker = self._workers[slot]
        payloads = [payload for _, payload in chunk]
        seq = next(self._seqs)
        try:
            worker.outbox.send((kind, seq, payloads))
        except OSError:  # died while idle: replace and resend once
            worker = self._replace(slot)
            worker.outbox.send((kind, seq, payloads))
        sent_at = time.monotonic()
        answered = [False] * len(chunk)
        remaining = len(chunk)
        budget = self._budget(kind)
        while remaining:
            failure = None
            if worker.inbox.poll(POLL_S):
                try:
                    batch = worker.inbox.recv()
                except (EOFError, OSError):
                    failure = (Status.ERROR, f"worker process died (exit code {worker.proc.wait()}) while running it")
                else:
                    for position, result in batch:
                        answered[position] = True
                        remaining -= 1
                        job.set(chunk[position][0], result)
                    sent_at = time.monotonic()
                    continue
            else:
                running, elapsed = worker.running(seq)
                if running >= 0 and elapsed > budget:
                    failure = (Status.TIMEOUT, f"killed by the executor backstop after {elapsed:.1f}s")
                elif worker.proc.poll() is not None:
                    failure = (Status.ERROR, f"worker process died (exit code {worker.proc.returncode}) while running it")
                elif running < 0 and time.monotonic() - sent_at > budget:
                    failure = (Status.ERROR, "worker stopped responding before running it")
            if failure is not None:
                running, _ = worker.running(seq)
                worker = self._replace(slot)
                if 0 <= running < len(chunk) and not answered[running]:
                    index, payload = chunk[running]
                    answered[running] = True
                    job.set(index, self._failed(kind, payload, failure[1], failure[0]))
                rest = [entry for entry, done in zip(chunk, answered) if not done]
                if running < 0 and attempt >= MAX_ATTEMPTS:  # nothing to blame, and retried enough
                    for index, payload in rest:
                        job.set(index, self._failed(kind, payload, failure[1], failure[0]))
                else:
                    self._requeue(job, kind, rest, attempt + 1 if running < 0 else attempt)
                return

    def _requeue(self, job: _Job, kind: str, rest: list, attempt: int) -> None:
        if rest:
            self._queue.put((job, kind, rest, attempt))

    def _replace(self, slot: int) -> _WorkerProcess:
        self._workers[slot].kill()
        with self._stats_lock:
            self.restarts += 1
        self._workers[slot] = self._spawn()
        return self._workers[slot]

    def _failed(self, kind: str, payload, message: str, status: Status = Status.ERROR):
        if kind == "exec":
            return Outcome(status, error=message)
        reward = self.table.timeout if status is Status.TIMEOUT else self.table.error
        return ScoreResult(payload.id, False, reward, status.value, status.value, pred_error=message,
                           gold_error=message)

    def stats(self) -> dict:
        with self._stats_lock:
            return {"workers": self.workers, "restarts": self.restarts, "queue_depth": self._inflight,
                    "outcomes": dict(self.outcomes), "limits": asdict(self.limits)}
