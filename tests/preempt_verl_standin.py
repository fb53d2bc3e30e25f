"""Stands in for verl's entry point in the preemption tests: `python -m preempt_verl_standin DIR`.

Like verl it installs no handler of its own for SIGTERM / SIGUSR1 in its main process; it has a helper in its
process group (as Ray's and vLLM's processes are), saves a "checkpoint" after step 2 the way verl marks one
complete (`latest_checkpointed_iteration.txt`), prints verl's step lines and then trains step 3 for 10 s. What each
process received goes to DIR: `helper.sig`, `main.sig`; `main.exited` is written just before it dies, half a
second after the signal, so the test can tell that the launcher waited for it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

HELPER = """
import signal, sys, time
from pathlib import Path
out = Path(sys.argv[1])
def record(signum, frame):
    (out / "helper.sig").write_text(signal.Signals(signum).name)
    sys.exit(0)
for s in (signal.SIGTERM, signal.SIGUSR1):
    signal.signal(s, record)
(out / "helper.ready").write_text("")
time.sleep(10)
"""


def main(out: Path) -> None:
    helper = subprocess.Popen([sys.executable, "-c", HELPER, str(out)])
    while not (out / "helper.ready").exists():
        time.sleep(0.02)

    def die(signum, frame):  # verl's default: the signal ends it; the recording and the delay are the test's
        (out / "main.sig").write_text(signal.Signals(signum).name)
        helper.wait()
        time.sleep(0.5)
        (out / "main.exited").write_text("")
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    for s in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(s, die)
    for step in (1, 2, 3):
        print(f"(TaskRunner pid={os.getpid()}) step:{step} - actor/entropy:0.5", flush=True)
        if step == 2:
            (out / "checkpoints" / "global_step_2").mkdir(parents=True)
            (out / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("2")
    time.sleep(10)  # "training" step 3; a signal that never comes lets it finish (exit 0) and the test fail


if __name__ == "__main__":
    main(Path(sys.argv[1]))
