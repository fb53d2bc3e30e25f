"""Preemption outside the local trainer: the light halts module, signals forwarded to the verl child and by
the Slurm script, and signals during SFT / pass-rate estimation."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_halts_module_imports_without_torch():
    """The verl launcher and the commands raise and catch `Preempted` without the local trainer's torch."""
    code = ("import sys, sirius_train.halts as h; "
            "print(issubclass(h.Preempted, h.TrainingHalted), issubclass(h.NonFiniteGradients, h.TrainingHalted), "
            "[m for m in ('torch', 'transformers') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}).stdout
    assert out.split("\n")[0] == "True True []"
