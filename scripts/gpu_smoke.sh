#!/usr/bin/env bash
# GPU smoke test, one prepared script, under 8 minutes on one GPU:
#   1. environment report (GPU, torch, CUDA, verl, vLLM), then `sirius doctor` on the
#      configs below (versions against the tested set, memory plans)            -> $OUT/env.txt, $OUT/doctor_*.txt
#   2. the local backend on the GPU: nano schedule (SFT + two short DAPO stages)    -> $OUT/local/summary.json
#   3. verl, when it and vLLM import here: dry-run of every shipped config, then
#      the nano schedule with --backend verl on this one GPU                       -> $OUT/verl/summary.json
# Every step is timed and bounded; a missing piece is reported and skipped, never fatal to the others.
#
#   scripts/gpu_smoke.sh                   # from the repository root; PYTHON=/path/to/python to choose one
#   OUT=/tmp/smoke scripts/gpu_smoke.sh
#   SMOKE_MODEL=/models/Qwen2.5-0.5B-Instruct scripts/gpu_smoke.sh   # also configs/smoke_1gpu.yaml on that model
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
OUT="${OUT:-$PWD/gpu_smoke_out}"
PYTHON="${PYTHON:-python3}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
results="$OUT/results.tsv"
printf 'step\tstatus\tseconds\tdetail\n' >"$results"

record() {  # step status seconds detail
    printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" | tee -a "$results"
}

timed() {  # name limit_s log command... : run with a time limit, record status and wall time
    local name="$1" limit="$2" log="$3"
    shift 3
    local start end code
    start=$(date +%s)
    timeout --signal=TERM --kill-after=20 "$limit" "$@" >"$log" 2>&1
    code=$?
    end=$(date +%s)
    if [[ $code -eq 0 ]]; then
        record "$name" ok "$((end - start))" "$log"
    else
        record "$name" "failed(code $code)" "$((end - start))" "$(tail -3 "$log" | tr '\t\n' '  ')"
    fi
    return $code
}

# ---- 1. environment
{
    nvidia-smi -L 2>&1 || echo "nvidia-smi: not available"
    "$PYTHON" - <<'PY'
import importlib, platform, sys
print("python", sys.version.split()[0], platform.machine())
try:
    import torch
    print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(),
          torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
except Exception as e:  # noqa: BLE001
    print("torch: not importable:", e)
for name in ("transformers", "tokenizers", "sqlglot", "omegaconf", "typer", "rich", "fastapi", "pyarrow",
             "verl", "vllm", "ray", "transfer_queue"):
    try:
        module = importlib.import_module(name)
        print(name, getattr(module, "__version__", "?"))
    except Exception as e:  # noqa: BLE001
        print(name, "MISSING", type(e).__name__)
PY
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
if ! "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    record environment failed 0 "no CUDA GPU visible to $PYTHON (see env.txt)"
    exit 1
fi
record environment ok 0 "$(grep -m1 '^torch' "$OUT/env.txt")"

# verl on this one GPU: the shape step 3 runs, and what doctor checks first
# (prompt + answer within the nano model's 1024 positions: vLLM refuses a longer max_model_len)
VERL1=(verl.n_gpus_per_node=1 verl.rollout_tp=1 verl.gpu_memory_utilization=0.3 verl.reward_workers=2
       verl.max_prompt_length=512 verl.strategy=fsdp2)
if ! "$PYTHON" -c "import flash_attn" >/dev/null 2>&1; then
    VERL1+=(verl.attn_implementation=sdpa)  # verl's default flash_attention_2 needs the flash-attn package
fi
timed doctor_nano 120 "$OUT/doctor_nano.txt" "$PYTHON" -m sirius_train.cli doctor configs/nano.yaml
timed doctor_nano_verl 120 "$OUT/doctor_nano_verl.txt" \
    "$PYTHON" -m sirius_train.cli doctor configs/nano.yaml backend=verl "${VERL1[@]}"
if [[ -n "${SMOKE_MODEL:-}" ]]; then
    timed doctor_smoke_1gpu 120 "$OUT/doctor_smoke_1gpu.txt" \
        "$PYTHON" -m sirius_train.cli doctor configs/smoke_1gpu.yaml model.path="$SMOKE_MODEL"
fi

# A short nano schedule: same code path as `make demo`, sized to finish in a few minutes. 16 SFT epochs: at 4 every
# pass rate was 0, both curricula were empty and verl never launched (configs/verl_cpu_smoke.yaml, measured on CPU).
SMALL=(data.generated_train_dbs=8 data.synth_per_db=60 data.generated_eval_dbs=2 data.eval_per_db=30
       sft.epochs=16 logging.plots=false
       stages.0.steps=6 stages.0.budget=96 stages.1.steps=6 stages.1.budget=96)

# ---- 2. local backend on the GPU
timed local_backend 300 "$OUT/local.log" \
    "$PYTHON" -m sirius_train.cli train configs/nano.yaml device=cuda name=local output_dir="$OUT" \
    data.db_root="$OUT/dbs" "${SMALL[@]}"
if [[ -f "$OUT/local/summary.json" ]]; then
    "$PYTHON" -c "import json,sys; s=json.load(open(sys.argv[1])); print('local EX', s['eval_exec_acc'], \
'seconds', s['wall_seconds_this_invocation'])" "$OUT/local/summary.json" | tee -a "$results"
fi

# ---- 3. verl (only when verl, vLLM and TransferQueue import here)
if "$PYTHON" -c "import verl, vllm, transfer_queue" >/dev/null 2>&1; then
    for config in "configs/nano.yaml backend=verl" configs/qwen7b_8gpu.yaml configs/sirius32b.yaml; do
        # shellcheck disable=SC2086  # config carries its overrides
        timed "dry_run $(basename ${config%% *})" 120 "$OUT/dry_run_$(basename ${config%% *} .yaml).log" \
            "$PYTHON" -m sirius_train.cli train $config --dry-run
    done
    timed verl_backend 330 "$OUT/verl.log" \
        "$PYTHON" -m sirius_train.cli train configs/nano.yaml --backend verl name=verl output_dir="$OUT" \
        data.db_root="$OUT/dbs" "${SMALL[@]}" stages.0.steps=2 stages.1.steps=2 "${VERL1[@]}"
    if [[ -f "$OUT/verl/summary.json" ]]; then
        "$PYTHON" -c "import json,sys; s=json.load(open(sys.argv[1])); print('verl EX', s['eval_exec_acc'], \
'seconds', s['wall_seconds_this_invocation'])" "$OUT/verl/summary.json" | tee -a "$results"
    fi
    if [[ -n "${SMOKE_MODEL:-}" ]]; then
        timed verl_smoke_1gpu 600 "$OUT/verl_smoke_1gpu.log" "$PYTHON" -m sirius_train.cli train configs/smoke_1gpu.yaml \
            model.path="$SMOKE_MODEL" output_dir="$OUT" data.db_root="$OUT/dbs"
    fi
else
    record verl_backend skipped 0 "verl, vllm or transfer_queue does not import with $PYTHON (see env.txt)"
fi

echo "results: $results"
