"""Pass-rate estimation on CPU: one process vs. the Ray fan-out, on a real run's RL pool and SFT policy.

    sirius sft configs/nano.yaml threads=1                       # the policy: runs/nano/sft/model
    PYTHONPATH=. python benchmarks/bench_scale.py --run runs/nano --examples 96 --rounds 3

What is compared: the stage-1 step "pass rates of the RL pool under the current policy" (k = 8 answers per
example, nano stage-1 sampling: temperature 1, 48 new tokens, chunks of 8 examples), on the first
`--examples` examples of `<run>/data/rl.jsonl`, with the run's own prompt format, by three contenders that
must return identical estimates (checked every round):

| contender | what it does |
|---|---|
| one-1t | `difficulty.estimate` with one `HFSampler` in this process, 1 torch thread |
| one-2t | the same with 2 torch threads (torch's default on 2 cores) |
| ray-2x1 | `ray_sampler.distributed_estimate`: a local Ray cluster, 2 actors of 1 CPU each holding an `HFSampler` (Ray gives each 1 thread); scoring in the driver |

Each contender runs in a fresh process per round (no warm caches), contenders take turns round by round, and
ratios compare medians. Wall time includes everything a user waits for (model load; for Ray, starting the
cluster and the actors, reported apart as `startup s`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

CONTENDERS = ("one-1t", "one-2t", "ray-2x1")
SAMPLING = {"k": 8, "temperature": 1.0, "max_new_tokens": 48, "seed": 0, "batch_size": 8}


def run_contender(name: str, run_dir: Path, n: int) -> dict:
    """One timed estimation in this (fresh) process; returns wall time and the estimates."""
    t0 = time.monotonic()
    import torch

    torch.set_num_threads(2 if name == "one-2t" else 1)
    from functools import partial

    from data_synthesis.difficulty import estimate
    from data_synthesis.records import read_examples
    from data_synthesis.samplers import HFSampler
    from sirius_train.config import load_config
    from sirius_train.schedule import prompt_format

    cfg = load_config(run_dir / "config.yaml")
    pool = read_examples(run_dir / "data" / "rl.jsonl")[:n]
    model = str(run_dir / "sft" / "model")
    options = dict(db_root=cfg.data.db_root, temperature=SAMPLING["temperature"],
                   max_new_tokens=SAMPLING["max_new_tokens"], seed=SAMPLING["seed"],
                   batch_size=SAMPLING["batch_size"], prompt_format=prompt_format(cfg), compare=cfg.data.compare)
    startup = 0.0
    if name.startswith("one"):
        estimates = estimate(pool, HFSampler(model, batch_size=64, device="cpu"), k=SAMPLING["k"], **options)
    else:
        import ray

        from data_synthesis.ray_sampler import distributed_estimate

        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
        startup = time.monotonic() - t0
        estimates = distributed_estimate(pool, partial(HFSampler, model, batch_size=64, device="cpu"),
                                         k=SAMPLING["k"], actors=2, num_cpus=1, **options)
        ray.shutdown()
    return {"contender": name, "wall_s": time.monotonic() - t0, "startup_s": startup,
            "estimates": [e.to_json() for e in estimates]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, required=True, help="a `sirius sft` run directory")
    parser.add_argument("--examples", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--contender", choices=CONTENDERS, help=argparse.SUPPRESS)  # one timed run (internal)
    args = parser.parse_args()
    if args.contender:
        print(json.dumps(run_contender(args.contender, args.run, args.examples)))
        return
    results: dict[str, list[dict]] = {c: [] for c in CONTENDERS}
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    for r in range(args.rounds):
        for c in CONTENDERS:
            out = subprocess.run([sys.executable, __file__, "--run", str(args.run), "--examples", str(args.examples),
                                  "--contender", c], env=env, capture_output=True, text=True, check=True)
            results[c].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"round {r + 1} {c}: {results[c][-1]['wall_s']:.1f} s", file=sys.stderr)
    reference = results["one-1t"][0]["estimates"]
    same = all(res["estimates"] == reference for runs in results.values() for res in runs)
    base = statistics.median(res["wall_s"] for res in results["one-1t"])
    rates = [e["pass_rate"] for e in reference]
    print(f"{args.examples} examples x k={SAMPLING['k']} ({args.examples * SAMPLING['k']} answers), mean pass rate "
          f"{sum(rates) / len(rates):.3f}; identical estimates in every run: {same}\n")
    print("| contender | wall s (median) | startup s | examples/s | vs one-1t |")
    print("|---|---|---|---|---|")
    for c in CONTENDERS:
        wall = statistics.median(res["wall_s"] for res in results[c])
        startup = statistics.median(res["startup_s"] for res in results[c])
        print(f"| {c} | {wall:.1f} | {startup:.1f} | {args.examples / wall:.2f} | {base / wall:.2f}x |")


if __name__ == "__main__":
    main()
