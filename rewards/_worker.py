"""Executor worker process: `python -m rewards._worker READ_FD WRITE_FD STATE_FD`.

Started with a plain `subprocess.Popen` (not multiprocessing) so it never re-imports the caller's
`__main__` and never inherits a forked copy of a threaded parent. It receives its configuration as
the first message, then chunks of work. Before each item it writes `(chunk number, item index, start time)` into
a small shared-memory record, so the parent's backstop knows which item is in flight without a
message per item; results go back in batches tagged with the chunk number (at the end of a chunk, or
every few milliseconds). Score items arrive and leave as plain tuples (cheap to pickle): the arguments and
the result of `Scorer.score_fields`.
"""

from __future__ import annotations

import mmap
import resource
import struct
import sys
import time
from multiprocessing.connection import Connection

STATE = struct.Struct("qqd")  # (chunk sequence number, index of the running item or -1, monotonic start time)
FLUSH_EVERY_S = 0.02


def main(read_fd: int, write_fd: int, state_fd: int) -> None:
    inbox, outbox = Connection(read_fd, writable=False), Connection(write_fd, readable=False)
    state = mmap.mmap(state_fd, STATE.size)
    config = inbox.recv()
    memory = config.pop("memory_limit_bytes", None)
    if memory:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    from rewards.scoring import Scorer  # after the rlimit, so imports count too

    scorer = Scorer(**config)
    outbox.send("ready")
    while True:
        try:
            message = inbox.recv()
        except EOFError:  # the parent went away
            return
        if message is None:
            return
        kind, seq, payloads = message
        batch, last_flush = [], time.monotonic()
        for i, payload in enumerate(payloads):
            STATE.pack_into(state, 0, seq, i, time.monotonic())
            if kind == "score":
                batch.append((i, scorer.score_fields(*payload)))
            else:
                batch.append((i, scorer.execute(*payload)))
            now = time.monotonic()
            if now - last_flush > FLUSH_EVERY_S:
                outbox.send((seq, batch))
                batch, last_flush = [], now
        STATE.pack_into(state, 0, seq, -1, 0.0)
        if batch:
            outbox.send((seq, batch))


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
