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
  comes back as a typed ERROR, and the rest of its chunks is re-queued -- nothing is lost, nothing hangs.

Throughput (see docs/benchmarks/executor.md): identical pairs of one batch are scored once and the
answer is copied (same database, same SQL, same gold: same result -- like the gold cache, this is
what RL batches are full of, G samples per prompt); items travel as plain tuples (a fraction of the
pickling cost of dataclasses); chunks are as large as `chunk_size` allows while every worker still
gets two (a round trip to a worker costs about 0.1 ms of CPU, as much as three Spider queries); and
each worker has a second small chunk waiting in its pipe while it runs one, so it never idles while
the parent collects results.

Submission never blocks: `submit_score` / `submit_execute_many` return a `concurrent.futures.Future`
(an async caller wraps it with `asyncio.wrap_future`). Cancelling that future drops the batch's chunks
that have not started, so a client that gave up does not keep the workers busy.

`workers=0` runs a Scorer in the calling thread instead (no backstop; for tests and tiny jobs).
"""

from __future__ import annotations

import itertools
import mmap
import os
import pickle
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import asdict, astuple
from multiprocessing.connection import Connection
from pathlib import Path

from rewards.outcome import Outcome, Status
from rewards.reward import RewardTable
from rewards.sandbox import Limits
from rewards._worker import STATE
from rewards.scoring import ScoreItem, ScoreResult, Scorer
from rewards.suites import Suite

OnResult = Callable[[int, object], None]
POLL_S = 0.05  # how often an idle wait checks the backstop
STARTUP_TIMEOUT_S = 60.0
MAX_ATTEMPTS = 2  # re-sends of a chunk whose worker stalled before starting any item of it
DIED_ONCE = MAX_ATTEMPTS + 1  # the attempt mark of an item re-run alone on a fresh worker after its worker died
PIPELINE_DEPTH = 2  # chunks in a worker's pipe at once: it starts the next while the parent reads results
PIPELINE_MAX_BYTES = 16 << 10  # only this small a message may wait in the pipe (two always fit its 64 KiB)


def chunk_length(items: int, chunk_size: int, workers: int) -> int:
    """Items per chunk of a batch: at most `chunk_size`, and few enough that every worker gets two chunks.

    Example:
        >>> chunk_length(4166, 64, 2), chunk_length(100, 64, 2), chunk_length(256, 64, 8), chunk_length(3, 64, 2)
        (64, 25, 16, 1)
    """
    return max(1, min(chunk_size, -(-items // (2 * workers))))


class _Job:
    """One caller's batch: results by position, and the future the caller holds.

    Workers answer with a raw result per distinct payload; `build(index, raw)` makes the caller's
    result for each position that payload stands for (its own id, for scores). `record(fresh)` is
    told of each newly answered group, once per batch (the executor's counters)."""

    def __init__(self, n: int, build: Callable[[int, object], object], record: Callable[[list], None],
                 on_result: OnResult | None):
        self.results: list = [None] * n
        self.remaining = n
        self.build, self.record, self.on_result = build, record, on_result
        self.lock = threading.Lock()
        self.future: Future = Future()
        if n == 0:
            self.future.set_result([])

    def set(self, answers: Sequence[tuple[Sequence[int], object]]) -> None:
        """Record `(positions, raw)` answers; a position already answered keeps its first answer."""
        fresh = []
        with self.lock:
            for indices, raw in answers:
                for index in indices:
                    if self.results[index] is None:  # never answer an item twice
                        self.results[index] = result = self.build(index, raw)
                        fresh.append((index, result))
            self.remaining -= len(fresh)
            finished = bool(fresh) and self.remaining == 0
        self.record(fresh)
        if self.on_result is not None:
            for index, result in fresh:
                self.on_result(index, result)
        if finished:
            try:
                self.future.set_result(self.results)
            except InvalidStateError:  # the caller cancelled it meanwhile
                pass


class _Sent:
    """A chunk in a worker's pipe: `entries` are (positions in the job, payload); what is answered so far."""

    def __init__(self, seq: int, job: _Job, kind: str, entries: list, attempt: int):
        self.seq, self.job, self.kind, self.entries, self.attempt = seq, job, kind, entries, attempt
        self.answered = [False] * len(entries)
        self.remaining = len(entries)

    def answer(self, batch: Sequence[tuple[int, object]]) -> None:
        """Record `(position in this chunk, raw result)` pairs from the worker."""
        answers = []
        for position, raw in batch:
            if not self.answered[position]:
                self.answered[position] = True
                self.remaining -= 1
                answers.append((self.entries[position][0], raw))
        self.job.set(answers)

    def unanswered(self) -> list:
        return [entry for entry, done in zip(self.entries, self.answered) if not done]


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
        chunk_size: most items sent to a worker at once. A round trip to a worker costs about 0.1 ms of CPU,
            so large batches go in chunks this big; a smaller batch is cut into two chunks per worker, so that
            every worker gets a share. A killed worker's chunk is re-queued, less the item it was running.
        grace_s: slack added to the SQLite deadline before the process backstop fires.
        memory_limit_bytes: RLIMIT_AS of each worker process.
        suite: databases a prediction must also match on (`rewards.suites`: K variants, a test-suite folder).
            Variants missing from their cache are built in the caller's thread before the batch is queued, so
            a worker never spends a query's budget on building them.
    """

    def __init__(self, db_root: str | Path, *, workers: int = 2, limits: Limits = Limits(),
                 table: RewardTable = RewardTable(), chunk_size: int = 64, grace_s: float = 0.5,
                 memory_limit_bytes: int | None = 4 << 30, suite: Suite = Suite()):
        if workers < 0:
            raise ValueError(f"workers must be >= 0, got {workers}")
        self.db_root = Path(db_root)
        if not self.db_root.is_dir():
            raise FileNotFoundError(f"database root is not a directory: {self.db_root}")
        self.limits, self.table, self.suite = limits, table, suite
        self._prepared: set[str] = set()  # db_ids whose suite databases exist on disk
        # the most databases a test-suite folder holds for one db_id (the backstop's budget allows for all)
        self._folder_size = max((sum(".sqlite" in f.name for f in d.iterdir()) for d in self.db_root.iterdir()
                                 if d.is_dir()), default=1) if suite.folder else 0
        self.chunk_size = max(1, chunk_size)
        self.grace_s = grace_s
        self.restarts = 0
        self.outcomes: Counter = Counter()
        self._stats_lock = threading.Lock()
        self._config = {"db_root": str(self.db_root), "limits": limits, "table": table,
                        "memory_limit_bytes": memory_limit_bytes, "suite": suite}
        self._queue: queue.Queue = queue.Queue()
        self._inflight = 0
        self._seqs = itertools.count(1)  # chunk numbers, so a worker's state record names the chunk it runs
        self._closed = False
        self._local: Scorer | None = None
        self._local_lock = threading.Lock()
        self._workers: list[_WorkerProcess] = []
        self._threads: list[threading.Thread] = []
        if workers == 0:
            self._local = Scorer(self.db_root, limits, table, suite=suite)
            return
        self._workers = [_WorkerProcess(self._config) for _ in range(workers)]  # they start side by side
        try:
            for worker in self._workers:
                worker.wait_ready(STARTUP_TIMEOUT_S)
        except RuntimeError:
            for worker in self._workers:
                worker.kill()
            raise
        for slot in range(workers):
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
        items = list(items)
        payloads = [(it.db_id, it.gold_sql, it.pred_sql, it.compare) for it in items]
        self.prepare_suites([it.db_id for it in items])
        return self._submit("score", payloads, lambda i, raw: ScoreResult(items[i].id, *raw), on_result)

    def submit_execute_many(self, queries: Sequence[tuple[str, str]], on_result: OnResult | None = None) -> Future:
        """Like `execute_many`, without waiting: a future of the outcomes."""
        return self._submit("exec", [(db_id, sql) for db_id, sql in queries], lambda i, raw: raw, on_result)

    def execute(self, db_id: str, sql: str) -> Outcome:
        return self.execute_many([(db_id, sql)])[0]

    def prepare_suites(self, db_ids: Sequence[str]) -> None:
        """Build the suite databases (variants) of `db_ids` that are not on disk yet. Safe from any thread and
        process (the cache locks); a database that cannot be resolved or built is left to the scorer to report."""
        if not self.suite.variants:
            return
        from rewards.databases import UnknownDatabase, resolve_db_path
        from rewards.variants import VariantError

        for db_id in dict.fromkeys(db_ids):
            if db_id in self._prepared:
                continue
            try:
                self.suite.extra_paths(resolve_db_path(self.db_root, db_id))
            except (UnknownDatabase, VariantError, OSError):
                continue  # the worker's scorer meets the same problem and answers with a typed result or a warning
            self._prepared.add(db_id)

    @property
    def workers(self) -> int:
        return len(self._workers)

    def queue_depth(self) -> int:
        """Items submitted and not yet answered (queued or running)."""
        with self._stats_lock:
            return self._inflight

    def stats(self) -> dict:
        with self._stats_lock:
            return {"workers": self.workers, "restarts": self.restarts, "queue_depth": self._inflight,
                    "outcomes": dict(self.outcomes), "limits": asdict(self.limits)}

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

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ------------------------------------------------------------------ submission
    def _submit(self, kind: str, payloads: list, build: Callable, on_result: OnResult | None) -> Future:
        if self._closed:
            raise RuntimeError("executor is closed")
        job = _Job(len(payloads), build, self._record, on_result)
        with self._stats_lock:
            self._inflight += len(payloads)
        if self._local is not None:
            with self._local_lock:
                for i, payload in enumerate(payloads):
                    job.set([((i,), self._local_run(kind, payload))])
            return job.future
        positions: dict[tuple, list[int]] = {}  # identical payloads run once
        for i, payload in enumerate(payloads):
            positions.setdefault(payload, []).append(i)
        # Sorted by (database, gold SQL): a chunk reuses one connection and one cached gold result.
        entries = sorted(((tuple(at), payload) for payload, at in positions.items()),
                         key=lambda entry: (entry[1][0], entry[1][1] if kind == "score" else ""))
        size = chunk_length(len(entries), self.chunk_size, self.workers)
        for start in range(0, len(entries), size):
            self._queue.put((job, kind, entries[start:start + size], 0))
        return job.future

    def _local_run(self, kind: str, payload: tuple):
        if kind == "exec":
            return self._local.execute(*payload)
        return self._local.score_fields(*payload)

    def _record(self, fresh: list) -> None:
        """Count newly answered items by outcome (prediction status for scores)."""
        statuses = [r.pred_status if isinstance(r, ScoreResult) else r.status.value for _, r in fresh]
        with self._stats_lock:
            self._inflight -= len(statuses)
            self.outcomes.update(statuses)

    def _forget(self, entries: list) -> None:
        """Items of a cancelled job that will never run: they leave the queue depth unanswered."""
        with self._stats_lock:
            self._inflight -= sum(len(at) for at, _ in entries)

    def _fail_leftovers(self) -> None:
        """Answer chunks still queued after the dispatchers stopped (re-queued behind the stop marks)."""
        while True:
            try:
                task = self._queue.get_nowait()
            except queue.Empty:
                return
            if task is not None:
                job, kind, entries, _ = task
                failed = self._failed(kind, "executor closed before running it")
                job.set([(at, failed) for at, _ in entries])

    # ------------------------------------------------------------------ one dispatcher thread per worker
    def _serve(self, slot: int) -> None:
        """Keep worker `slot` fed (up to PIPELINE_DEPTH chunks), collect its results, run its backstop."""
        sent: deque[_Sent] = deque()
        held = None  # a chunk too big to wait in the pipe: it goes next, once the worker is idle
        progress_at = time.monotonic()  # when this worker last answered, or got work while idle
        stopping = False
        while True:
            try:
                was_idle = not sent
                while len(sent) < PIPELINE_DEPTH and (held is not None or not stopping):
                    task, held = held or self._next_task(wait=not sent), None
                    if task is None:
                        break
                    if not self._send(slot, sent, task):
                        held = task
                        break
                if was_idle and sent:
                    progress_at = time.monotonic()
                if not sent:
                    if stopping and held is None:
                        return
                    continue
                if self._collect(slot, sent, progress_at):
                    progress_at = time.monotonic()
            except _Stop:
                stopping = True
            except Exception as e:  # never leave a caller waiting on a bug of ours
                for chunk in sent:
                    failed = self._failed(chunk.kind, f"executor error: {type(e).__name__}: {e}")
                    chunk.job.set([(at, failed) for at, _ in chunk.unanswered()])
                sent.clear()
                if held is not None:
                    self._queue.put(held)
                    held = None

    def _next_task(self, wait: bool):
        """The next chunk to run (None if there is none now); raises _Stop at close()'s mark."""
        try:
            task = self._queue.get(timeout=POLL_S) if wait else self._queue.get_nowait()
        except queue.Empty:
            return None
        if task is None:
            raise _Stop
        job, _, entries, _ = task
        if job.future.cancelled():  # the caller gave up: skip what has not started
            self._forget(entries)
            return self._next_task(wait=False)
        return task

    def _send(self, slot: int, sent: deque, task: tuple) -> bool:
        """Put a chunk in the worker's pipe; False if it is too big to wait there behind another one."""
        job, kind, entries, attempt = task
        seq = next(self._seqs)
        message = pickle.dumps((kind, seq, [payload for _, payload in entries]), protocol=pickle.HIGHEST_PROTOCOL)
        if sent and len(message) > PIPELINE_MAX_BYTES:
            return False
        sent.append(_Sent(seq, job, kind, entries, attempt))
        try:
            self._workers[slot].outbox.send_bytes(message)
        except OSError:  # the worker is dead; `_collect` notices and re-queues this chunk
            pass
        return True

    def _collect(self, slot: int, sent: deque, progress_at: float) -> bool:
        """Wait briefly for results; run the backstop. True when the worker made progress."""
        worker = self._workers[slot]
        if worker.inbox.poll(POLL_S):
            try:
                seq, batch = worker.inbox.recv()
            except (EOFError, OSError):
                self._recover(slot, sent, Status.ERROR,
                              f"worker process died (exit code {worker.proc.wait()}) while running it", died=True)
                return True
            chunk = next(c for c in sent if c.seq == seq)  # the worker answers only chunks it was sent
            chunk.answer(batch)
            while sent and sent[0].remaining == 0:
                sent.popleft()
            return True
        seq, index, started = STATE.unpack_from(worker.state, 0)
        running = next((c for c in sent if c.seq == seq), None) if index >= 0 else None
        elapsed = time.monotonic() - started
        if running is not None and elapsed > self._budget(running.kind):
            self._recover(slot, sent, Status.TIMEOUT, f"killed by the executor backstop after {elapsed:.1f}s")
        elif worker.proc.poll() is not None:
            self._recover(slot, sent, Status.ERROR,
                          f"worker process died (exit code {worker.proc.returncode}) while running it", died=True)
        elif running is None and time.monotonic() - progress_at > self._budget(sent[0].kind):
            self._recover(slot, sent, Status.ERROR, "worker stopped responding before running it")
        else:
            return False
        return True

    def _recover(self, slot: int, sent: deque, status: Status, message: str, died: bool = False) -> None:
        """Replace the worker. The item it was running gets `status`; the rest of its chunks go back in the queue.

        `died`: the worker process was killed under the item (the OOM killer, an operator), which need not be the
        item's doing: it runs once more, alone, on a fresh worker, so a right answer is not scored as an error in
        its rollout group; only an item under which a worker dies twice is typed as the death."""
        worker = self._workers[slot]
        seq, index, _ = STATE.unpack_from(worker.state, 0)
        culprit = next((c for c in sent if c.seq == seq and index >= 0 and not c.answered[index]), None)
        retry = None
        if culprit is not None and died and culprit.attempt != DIED_ONCE:
            culprit.answered[index] = True  # out of this chunk: answered by its run alone
            culprit.remaining -= 1
            retry = (culprit.job, culprit.kind, [culprit.entries[index]], DIED_ONCE)
        elif culprit is not None:
            culprit.answer([(index, self._failed(culprit.kind, message, status))])
        self._replace(slot)
        for k, chunk in enumerate(sent):
            rest = chunk.unanswered()
            stalled = culprit is None and k == 0  # nothing to blame: the head chunk used up one attempt
            if stalled and chunk.attempt >= MAX_ATTEMPTS:
                failed = self._failed(chunk.kind, message, status)
                chunk.job.set([(at, failed) for at, _ in rest])
            elif rest:
                self._queue.put((chunk.job, chunk.kind, rest, chunk.attempt + stalled))
        if retry is not None:
            self._queue.put(retry)
        sent.clear()

    def _spawn(self) -> _WorkerProcess:
        worker = _WorkerProcess(self._config)
        worker.wait_ready(STARTUP_TIMEOUT_S)
        return worker

    def _replace(self, slot: int) -> _WorkerProcess:
        self._workers[slot].kill()
        with self._stats_lock:
            self.restarts += 1
        self._workers[slot] = self._spawn()
        return self._workers[slot]

    def _budget(self, kind: str) -> float:
        # a score item may run its gold and its prediction, and with a suite both (and the gold's tie probes,
        # at most two in practice) on each suite database
        extra = self.suite.variants + self._folder_size
        statements = 2 + 4 * extra if kind == "score" else 1
        return statements * (self.limits.timeout_s + self.grace_s)

    def _failed(self, kind: str, message: str, status: Status = Status.ERROR):
        """The raw answer for an item the executor could not run to the end."""
        if kind == "exec":
            return Outcome(status, error=message)
        reward = self.table.timeout if status is Status.TIMEOUT else self.table.error
        failed = ScoreResult(None, False, reward, status.value, status.value, pred_error=message, gold_error=message)
        return astuple(failed)[1:]  # the fields after `id`, as `Scorer.score_fields` gives them


class _Stop(Exception):
    """The close() mark was taken from the queue: finish what is in the pipe, then stop."""
