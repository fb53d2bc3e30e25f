"""Does the nano model's training depend on which CPU kernels run it? The question behind "can `make demo` be made
bit-for-bit reproducible across machines".

PyTorch picks its vectorised kernels by the processor's instruction set (`ATEN_CPU_CAPABILITY`: default, avx2,
avx512) and MKL picks its matrix-multiply code path the same way (`MKL_CBWR`: COMPATIBLE, AVX2, AVX512, ...); a
machine with AVX-512 or AMX takes other paths than one with AVX2 and sums in another order. Here each path this
processor can run is forced in turn, in a fresh process: nano's Llama shape (configs/nano.yaml's `model`) takes
--steps AdamW steps on fixed random tokens, then samples 8 answers at T = 0.7. Printed per setting: a hash of the
weights and of the sampled tokens, and the training seconds (run it under /work/wt/quiet for the seconds).

    python benchmarks/bench_cpu_determinism.py --steps 30
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# (label, environment, torch threads): the kernels this machine picks, each forced path, then two threads
SETTINGS = [
    ("as picked (1 thread)", {}, 1),
    ("ATEN_CPU_CAPABILITY=default", {"ATEN_CPU_CAPABILITY": "default"}, 1),
    ("MKL_CBWR=COMPATIBLE", {"MKL_CBWR": "COMPATIBLE"}, 1),
    ("both pinned", {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE"}, 1),
    ("as picked, 2 threads", {}, 2),
    ("as picked, 1 thread again", {}, 1),
]


def child(steps: int, threads: int) -> dict:
    """Train nano's model shape for `steps` steps and sample; the hashes of what came out."""
    import torch
    import yaml
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.set_num_threads(threads)
    m = yaml.safe_load((ROOT / "configs" / "nano.yaml").read_text())["model"]
    vocab = 1093  # the nano tokenizer's vocabulary on the demo's data
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=m["hidden_size"],
                                         intermediate_size=m["intermediate_size"],
                                         num_hidden_layers=m["num_hidden_layers"],
                                         num_attention_heads=m["num_attention_heads"], max_position_embeddings=1024))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    data = torch.randint(0, vocab, (32, 96), generator=torch.Generator().manual_seed(1))
    t0 = time.perf_counter()
    for _ in range(steps):
        model(input_ids=data, labels=data).loss.backward()
        opt.step()
        opt.zero_grad()
    seconds = time.perf_counter() - t0
    weights = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()[:12]
    torch.manual_seed(2)
    out = model.generate(data[:8, :40], do_sample=True, temperature=0.7, max_new_tokens=48, pad_token_id=0)
    return {"capability": torch.backends.cpu.get_cpu_capability(), "weights": weights,
            "samples": hashlib.sha256(out.numpy().tobytes()).hexdigest()[:12], "train_s": seconds}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--child", type=int, default=0, metavar="THREADS", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.steps, args.child)))
        return
    print("| setting | ATen kernels | weights after training | sampled tokens | same weights as picked | train s |")
    print("|---|---|---|---|---|---:|")
    first = None
    for label, env, threads in SETTINGS:
        out = subprocess.run([sys.executable, __file__, "--steps", str(args.steps), "--child", str(threads)],
                             env={**os.environ, **env}, check=True, capture_output=True, text=True).stdout
        r = json.loads(out.strip().splitlines()[-1])
        first = first or r["weights"]
        print(f"| {label} | {r['capability']} | {r['weights']} | {r['samples']} | "
              f"{'yes' if r['weights'] == first else 'no'} | {r['train_s']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
