#!/usr/bin/env bash
# GPU smoke of the cluster SFT path (issue 9), one prepared run:
#   1. a 0.5B-shaped Qwen2 model (Qwen2.5-0.5B dimensions, random weights, the nano tokenizer) built from a
#      config -- nothing is downloaded;
#   2. ~20 ZeRO-3 SFT steps of it through the real `sirius sft`, launched with torchrun on every local GPU;
#   3. a pass-rate pass over the held-out questions with the vLLM sampler, and the same pass with the HF
#      sampler for comparison -- when vllm is importable (pip install 'sirius-sql[vllm]'); said so when not.
# Figures land in $OUT/gpu_smoke.json (train runtime, steps/s, peak GPU memory, sampling wall times).
#
#   bash scripts/gpu_sft_smoke.sh                 # OUT=runs/gpu_smoke, all visible GPUs
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/gpu_smoke}
PY=${PY:-python}
NGPU=${NGPU:-$(nvidia-smi -L | wc -l)}
export PYTHONPATH=${PYTHONPATH:-$PWD}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
RUN="$OUT/runs/nano"
# ~20 optimizer steps on one GPU: (3 + 4 databases) x 33 examples x 0.7 SFT share / (8 per GPU x NGPU)
DATA=(data.db_root="$OUT/dbs" data.generated_train_dbs=4 data.synth_per_db=33 data.generated_eval_dbs=1
      data.eval_per_db=40)

echo "== 1. 0.5B-shaped model"
"$PY" - "$OUT" "${DATA[@]}" <<'EOF'
import sys
from pathlib import Path

from transformers import Qwen2Config, Qwen2ForCausalLM

from sirius_train.config import load_config
from sirius_train.local.model import count_parameters, train_tokenizer
from sirius_train.local.sft import answer_text
from sirius_train.schedule import prepare_data

out = Path(sys.argv[1])
cfg = load_config("configs/nano.yaml", [f"output_dir={out}/runs", *sys.argv[2:]])
data = prepare_data(cfg)  # the run's databases and pools; `sirius sft` reuses them
texts = [f"{e.question}\n{answer_text(e.gold_sql)}" for e in data.sft_pool + data.rl_pool]
tokenizer = train_tokenizer(texts * 2, 8192)
config = Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                     num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=4096,
                     tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
                     eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.eos_token_id)
model = Qwen2ForCausalLM(config)
model.generation_config.pad_token_id = tokenizer.pad_token_id
model.generation_config.eos_token_id = tokenizer.eos_token_id
model.save_pretrained(out / "model0p5b")
tokenizer.save_pretrained(out / "model0p5b")
print(f"0.5B-shaped model: {count_parameters(model) / 1e6:.0f}M parameters -> {out / 'model0p5b'}")
EOF

echo "== 2. ZeRO-3 SFT on $NGPU GPU(s)"
nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 > "$OUT/gpu_mem.log" &
SMI=$!
"$PY" -m torch.distributed.run --nproc_per_node "$NGPU" -m sirius_train.cli sft configs/nano.yaml \
    output_dir="$OUT/runs" "${DATA[@]}" model.path="$OUT/model0p5b" model.dtype=bfloat16 \
    sft.deepspeed=configs/deepspeed/zero3.json sft.batch_size=8 sft.epochs=1 sft.lr=2e-5 \
    sft.gradient_checkpointing=true logging.backends=[tensorboard] logging.plots=false
kill "$SMI"

echo "== 3. sampling pass"
SAMPLE=(synth estimate --pool "$RUN/data/eval.jsonl" --db-root "$OUT/dbs" --model "$RUN/sft/model" --k 8
        --max-new-tokens 64 --batch-size 8 --quiet)
VLLM_NOTE="vllm not importable here: its wheels did not travel (pip install 'sirius-sql[vllm]')"
timed() {  # timed NAME COMMAND...: wall seconds of COMMAND into $OUT/NAME.seconds
    local name=$1 t0=$EPOCHREALTIME
    shift
    "$@"
    "$PY" -c "import sys; print(float(sys.argv[2]) - float(sys.argv[1]))" "$t0" "$EPOCHREALTIME" \
        > "$OUT/$name.seconds"
}
if "$PY" -c "import vllm" 2>/dev/null; then
    VLLM_NOTE=""
    timed vllm "$PY" -m sirius_train.cli "${SAMPLE[@]}" --engine vllm --out "$OUT/rates_vllm.jsonl"
fi
timed hf "$PY" -m sirius_train.cli "${SAMPLE[@]}" --engine hf --out "$OUT/rates_hf.jsonl"

"$PY" - "$OUT" "$RUN" "$NGPU" "$VLLM_NOTE" <<'EOF'
import json
import sys
from pathlib import Path

out, run, ngpu, vllm_note = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
done = json.loads((run / "sft" / "DONE.json").read_text())
state = json.loads(next((run / "sft" / "trainer").glob("checkpoint-*/trainer_state.json")).read_text())
final = state["log_history"][-1]
mem = [int(x) for x in (out / "gpu_mem.log").read_text().split() if x.isdigit()]
figures = {
    "gpus": ngpu, "sft_steps": done["sft_steps"], "train_runtime_s": final.get("train_runtime"),
    "train_steps_per_s": final.get("train_steps_per_second"), "sft_loss": done["sft_loss"],
    "peak_gpu_memory_mib": max(mem) if mem else None, "eval_exec_acc_after_sft": done["eval_exec_acc"],
    "hf_sampling_s": float((out / "hf.seconds").read_text()),
    "vllm_sampling_s": float((out / "vllm.seconds").read_text()) if (out / "vllm.seconds").exists() else None,
    "vllm": vllm_note or "ran",
}
(out / "gpu_smoke.json").write_text(json.dumps(figures, indent=2))
print(json.dumps(figures, indent=2))
EOF
