"""Peak extra memory and wall time: chunked log-prob + entropy vs. the naive log_softmax route, on CPU.

    python benchmarks/bench_logprob_entropy.py                       # headline: forward, (4, 1024, 151936) fp32
    python benchmarks/bench_logprob_entropy.py --chunk-sizes auto,8,16,32,128 --backward

Method. Each (method, chunk size) runs in its own subprocess, one at a time, so allocator state and peaks
never mix and the naive route's ~10 GB cannot stack on another's. In the subprocess: allocate the logits in
place (`empty().normal_()`, no temporary), run the method once on a tiny input to load kernels, then reset the
kernel's resident-set high-water mark (write 5 to /proc/self/clear_refs) and read VmRSS. After the timed
repeats, VmHWM − that VmRSS is the *extra* peak memory the method needed above its input. This counts what
torch's CPU allocator really touched (tracemalloc cannot see it). Time is the median wall time of the repeats.
`--backward` times forward + backward of lp.sum() + entropy.sum(); its extra memory includes the
logits-sized gradient that any method must return.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch
from _memory import status_kib

from sirius_train.algorithms.logprob import DEFAULT_CHUNK_ELEMENTS, logprobs_and_entropy


def naive(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The textbook route: three logits-sized tensors (log_softmax, its exp, their product)."""
    logp = torch.log_softmax(logits, dim=-1)  # (B, T, V)
    return logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1), -(logp.exp() * logp).sum(-1)


def worker(method: str, chunk_size: int | None, B: int, T: int, V: int, repeats: int, backward: bool) -> dict:
    def run(logits, labels):
        if method == "naive":
            lp, ent = naive(logits, labels)
        else:
            lp, ent = logprobs_and_entropy(logits, labels, chunk_size=chunk_size)
        if backward:
            (lp.sum() + ent.sum()).backward()
            logits.grad = None

    torch.manual_seed(0)
    warm = torch.randn(2, 3, 50, requires_grad=backward)
    run(warm, torch.randint(0, 50, (2, 3)))
    logits = torch.empty(B, T, V).normal_().mul_(3.0).requires_grad_(backward)
    labels = torch.randint(0, V, (B, T))

    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    rss_before = status_kib("VmRSS")
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run(logits, labels)
        times.append(time.perf_counter() - start)
    return {"extra_gib": (status_kib("VmHWM") - rss_before) / 2**20, "times": times}


def measure(method: str, chunk_size: int | None, args) -> dict:
    chunk = "auto" if chunk_size is None else str(chunk_size)
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", method, "--chunk-sizes", chunk]
    cmd += ["--batch", str(args.batch), "--seq", str(args.seq), "--vocab", str(args.vocab)]
    cmd += ["--repeats", str(args.repeats)] + (["--backward"] if args.backward else [])
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=151_936)
    p.add_argument("--chunk-sizes", default="auto", help="comma-separated rows per chunk; auto = the default")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--backward", action="store_true", help="time forward + backward instead of forward only")
    p.add_argument("--worker", choices=["naive", "chunked"], help=argparse.SUPPRESS)
    args = p.parse_args()
    chunk_sizes = [None if c == "auto" else int(c) for c in args.chunk_sizes.split(",")]

    if args.worker:
        result = worker(args.worker, chunk_sizes[0], args.batch, args.seq, args.vocab, args.repeats, args.backward)
        print(json.dumps(result))
        return

    shape = f"({args.batch}, {args.seq}, {args.vocab}) fp32"
    input_gib = args.batch * args.seq * args.vocab * 4 / 2**30
    what = "forward + backward" if args.backward else "forward"
    print(f"{what}, logits {shape} = {input_gib:.2f} GiB, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, median of {args.repeats}\n")
    base = measure("naive", None, args)
    rows = [("naive (log_softmax + gather + full entropy)", "-", base)]
    auto = f"auto ({max(1, DEFAULT_CHUNK_ELEMENTS // args.vocab)})"
    rows += [
        ("chunked `logprobs_and_entropy`", auto if c is None else str(c), measure("chunked", c, args))
        for c in chunk_sizes
    ]
    base_time = statistics.median(base["times"])
    print("| method | chunk rows | extra peak memory (GiB) | vs naive | time (s) | vs naive |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, chunk, r in rows:
        t = statistics.median(r["times"])
        print(f"| {name} | {chunk} | {r['extra_gib']:.2f} | {r['extra_gib'] / base['extra_gib']:.3f}x "
              f"| {t:.2f} | {t / base_time:.2f}x |")


if __name__ == "__main__":
    main()
