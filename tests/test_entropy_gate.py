"""EntropyGate: the coefficient schedule, the indicator, checkpoint state, and that it prevents entropy collapse.

That a trainer step applies `-active_coefficient(H_k) * H` with the right sign and size is checked on the
local trainer itself (`test_trainer_update.py`) and inside verl (`test_verl_entropy_gate.py`)."""

import pytest
import torch

from sirius_train.algorithms.dapo import policy_loss
from sirius_train.algorithms.entropy import EntropyGate, EntropyGateConfig
from sirius_train.algorithms.logprob import logprobs_and_entropy

DELTA, C_MAX, TARGET = 1e-4, 0.005, 0.2


def test_defaults_are_skywork_or1():
    cfg = EntropyGateConfig()
    assert (cfg.mode, cfg.target, cfg.delta, cfg.coef_max, cfg.coef) == ("adaptive", TARGET, DELTA, C_MAX, 0.0)


def test_coefficient_stays_zero_while_entropy_is_at_or_above_target():
    gate = EntropyGate()
    for h in [1.0, 0.5, 0.2000001, TARGET, 3.0]:  # == target: sign(0) = 0, no change
        metrics = gate.update(h)
        assert gate.coefficient() == 0.0 and metrics["actor/entropy_gate_open"] == 0.0
        assert gate.active_coefficient(h) == 0.0
    assert gate.step == 5


def test_coefficient_rises_by_delta_per_step_below_target_and_is_clipped():
    gate = EntropyGate()
    previous = gate.coefficient()
    for k in range(1, 51):
        gate.update(0.05)
        assert gate.coefficient() - previous == pytest.approx(DELTA, abs=1e-12)
        assert gate.coefficient() == pytest.approx(k * DELTA, abs=1e-12)
        previous = gate.coefficient()
    for _ in range(20):
        gate.update(0.05)
    assert gate.coefficient() == C_MAX  # 70 steps · Δ would be 0.007
    # above target it decays by Δ per step, down to exactly 0
    gate.update(0.9)
    assert gate.coefficient() == pytest.approx(C_MAX - DELTA, abs=1e-12)
    for _ in range(60):
        gate.update(0.9)
    assert gate.coefficient() == 0.0


def test_update_reports_the_coefficient_the_step_trained_with():
    gate = EntropyGate()
    m = gate.update(0.1)  # first step below target trained with c_0 = 0
    assert m == {"actor/entropy_coef": 0.0, "actor/entropy_gate_open": 1.0, "actor/entropy_coef_next": DELTA}
    m = gate.update(0.1)
    assert m["actor/entropy_coef"] == DELTA and m["actor/entropy_coef_next"] == pytest.approx(2 * DELTA)


def test_the_coefficient_is_gated_by_the_entropy_it_reads():
    gate = EntropyGate(EntropyGateConfig(coef=0.003))
    assert gate.active_coefficient(0.1) == 0.003
    assert gate.active_coefficient(0.3) == 0.0
    assert gate.active_coefficient(TARGET) == 0.0  # strict: 1[H < H_target]


def test_first_step_below_target_still_trains_with_the_previous_coefficient():
    gate = EntropyGate()
    assert gate.active_coefficient(0.1) == 0.0  # c_0 = 0: nothing yet
    gate.update(0.1)
    assert gate.active_coefficient(0.1) == pytest.approx(DELTA)  # switched on at the next step, at c = Δ


def test_fixed_mode_is_constant_and_always_on():
    gate = EntropyGate(EntropyGateConfig(mode="fixed", coef=0.01))
    for h in [0.05, 0.5, 2.0]:
        assert gate.active_coefficient(h) == 0.01
        assert gate.update(h)["actor/entropy_gate_open"] == 1.0
    assert gate.coefficient() == 0.01


def test_off_mode_contributes_nothing():
    gate = EntropyGate(EntropyGateConfig(mode="off", coef=0.01))
    for _ in range(3):
        assert gate.active_coefficient(0.01) == 0.0
        gate.update(0.01)
    assert gate.coefficient() == 0.0


def test_unknown_mode_raises_listing_valid_ones():
    with pytest.raises(ValueError, match="adaptive, fixed, off"):
        EntropyGateConfig(mode="adaptve")


@pytest.mark.parametrize("kwargs", [dict(delta=-1e-4), dict(coef_max=-1.0), dict(coef=0.01), dict(coef=-0.1)])
def test_bad_numbers_raise(kwargs):
    with pytest.raises(ValueError):
        EntropyGateConfig(**kwargs)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_entropy_raises(bad):
    with pytest.raises(ValueError, match="finite"):
        EntropyGate().update(bad)


def test_state_round_trip_resumes_exactly():
    entropies = [0.3, 0.1, 0.1, 0.15, 0.25, 0.05, 0.05, 0.05]
    gate = EntropyGate()
    for h in entropies[:5]:
        gate.update(h)
    state = gate.state_dict()
    assert state == {"mode": "adaptive", "coef": gate.coefficient(), "step": 5}

    resumed = EntropyGate()
    resumed.load_state_dict(dict(state))
    assert resumed.coefficient() == gate.coefficient() and resumed.step == 5
    for h in entropies[5:]:
        assert resumed.update(h) == gate.update(h)
    assert resumed.state_dict() == gate.state_dict()
    with pytest.raises(ValueError, match="mode 'adaptive'"):
        EntropyGate(EntropyGateConfig(mode="fixed", coef=0.01)).load_state_dict(state)


def _train_categorical(gate: EntropyGate, steps: int = 300, K: int = 8, reward_range: float = 0.02) -> list[float]:
    """Exact policy gradient on one categorical "prompt" with K answers of graded reward: it collapses onto the best.

    Every answer is one token of a length-K batch; weighting its advantage by K·p makes the token-mean
    DAPO loss the exact gradient of −E_p[r]. A small reward range keeps the entropy bonus (c <= c_max = 0.005)
    on the same scale as the policy gradient, as it is for an LLM's per-token loss.
    """
    logits = torch.zeros(K, requires_grad=True)
    opt = torch.optim.Adam([logits], lr=0.05)
    reward = torch.linspace(0.0, reward_range, K)
    answers = torch.arange(K).view(1, K)
    history = []
    for _ in range(steps):
        log_prob, entropy = logprobs_and_entropy(logits.expand(1, K, K), answers)  # (1, K) each
        H = entropy[0, 0]  # the one distribution's entropy
        p = log_prob.detach().exp()
        advantages = K * p * (reward - (p * reward).sum())  # (1, K)
        pg_loss, _ = policy_loss(log_prob, log_prob.detach(), advantages, torch.ones(1, K))
        loss = pg_loss - gate.active_coefficient(H.item()) * H  # as the trainers apply it
        opt.zero_grad()
        loss.backward()
        opt.step()
        gate.update(H.item())
        history.append(H.item())
    return history


def test_gate_prevents_entropy_collapse_without_inflating_entropy():
    without = _train_categorical(EntropyGate(EntropyGateConfig(mode="off")))
    with_gate = _train_categorical(EntropyGate(EntropyGateConfig()))
    assert without[0] > 1.5  # starts near log 8 ≈ 2.08
    assert without[-1] < 0.25 * TARGET  # collapses without the gate
    tail = with_gate[-100:]
    assert min(tail) > 0.9 * TARGET  # held at the target ...
    assert max(tail) < 1.2 * TARGET  # ... not pushed far above it
