"""Threshold-gated adaptive entropy regularisation (adaptive entropy control of Skywork-OR1, He et al. 2025).

    loss_k = pg_loss − c_k · 1[H_k < H_target] · H,     c_{k+1} = clip(c_k + Δ·sign(H_target − H_k), 0, c_max)

H is the token-mean entropy of the answers being trained on (a differentiable tensor) and H_k its value.
The bonus is off while entropy is healthy, so it prevents collapse without pushing entropy up for its own sake.

Timing, precisely. During step k every loss term uses c_k, the coefficient left by the previous step's
`update` (c_0 = `coef`), and the indicator reads H_k, the token-mean entropy of the step's answers under
the policy before the step (pi_old: from sampling or the no-grad pass). Both backends call
`active_coefficient(H_k)` once per step and subtract that constant times the differentiable H from the
loss (verl through `actor.entropy_coeff`). `update(H_k)` runs once, after the step's gradient updates,
and yields c_{k+1}. Hence the first step below target still trains with c_k (0 at the start), and the
bonus switches on from the next step, at c = Δ.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the run config imports ENTROPY_MODES, and must not pull torch in
    import torch

ENTROPY_MODES = ("adaptive", "fixed", "off")


@dataclass(frozen=True)
class EntropyGateConfig:
    """Knobs of the entropy term; defaults are Skywork-OR1's (32B) and SPEC §3's."""

    mode: str = "adaptive"  # "adaptive": the gate above; "fixed": constant `coef`, always on; "off": no term
    target: float = 0.2  # H_target, nats per token
    delta: float = 1e-4  # Δ, coefficient change per step
    coef_max: float = 0.005  # c_max
    coef: float = 0.0  # c_0 in adaptive mode; the constant coefficient in fixed mode

    def __post_init__(self):
        if self.mode not in ENTROPY_MODES:
            raise ValueError(f"unknown entropy mode {self.mode!r}; valid modes: {', '.join(ENTROPY_MODES)}")
        if self.delta < 0 or self.coef_max < 0 or self.coef < 0:
            raise ValueError(f"delta, coef_max and coef must be >= 0, got {self.delta}, {self.coef_max}, {self.coef}")
        if self.mode == "adaptive" and self.coef > self.coef_max:
            raise ValueError(f"adaptive mode needs coef (c_0) <= coef_max, got {self.coef} > {self.coef_max}")


class EntropyGate:
    """Holds c_k between steps. Pure: no I/O; `state_dict()` goes into the trainer's checkpoint."""

    def __init__(self, config: EntropyGateConfig | None = None):
        self.config = config or EntropyGateConfig()
        self._coef = self.config.coef if self.config.mode != "off" else 0.0
        self.step = 0

    def coefficient(self) -> float:
        """c_k: the coefficient this step trains with when the gate is open (0 in off mode)."""
        return self._coef

    def active_coefficient(self, entropy: float) -> float:
        """c_k · 1[H_k < H_target] in adaptive mode, c in fixed mode, 0 when off."""
        entropy = _finite(entropy)
        if self.config.mode == "adaptive" and not entropy < self.config.target:
            return 0.0
        return self._coef

    def update(self, entropy: float) -> dict[str, float]:
        """End of step k: c_{k+1} = clip(c_k + Δ·sign(H_target − H_k), 0, c_max) (adaptive mode only).

        Returns `actor/entropy_coef` (c_k, the one step k trained with), `actor/entropy_gate_open`
        (1[H_k < H_target]) and `actor/entropy_coef_next` (c_{k+1}).
        """
        cfg = self.config
        entropy = _finite(entropy)
        coef_k = self._coef
        gate_open = entropy < cfg.target if cfg.mode == "adaptive" else cfg.mode == "fixed"
        if cfg.mode == "adaptive":
            direction = (cfg.target > entropy) - (cfg.target < entropy)  # sign(H_target − H_k)
            self._coef = min(max(coef_k + cfg.delta * direction, 0.0), cfg.coef_max)
        self.step += 1
        return {
            "actor/entropy_coef": coef_k,
            "actor/entropy_gate_open": float(gate_open),
            "actor/entropy_coef_next": self._coef,
        }

    def state_dict(self) -> dict[str, float | int | str]:
        return {"mode": self.config.mode, "coef": self._coef, "step": self.step}

    def load_state_dict(self, state: dict[str, float | int | str]) -> None:
        """Restore c_k and the step count; the config (target, Δ, c_max) comes from the run's config."""
        if state["mode"] != self.config.mode:
            raise ValueError(
                f"checkpoint entropy gate has mode {state['mode']!r} but this run is {self.config.mode!r}; "
                "set the run's entropy mode to match or start the gate fresh"
            )
        self._coef = float(state["coef"])
        self.step = int(state["step"])


def _finite(entropy: float | torch.Tensor) -> float:
    value = float(entropy)
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"batch entropy must be finite, got {value}; the policy or its logits have diverged")
    return value
