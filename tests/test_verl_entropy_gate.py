"""The threshold-gated entropy bonus inside verl: the gate's coefficient reaches the loss verl computes.

Chain under test: our registered trainer (driver) reads H_k, sends c_k·1[H_k < H_target] with the update
batch, and steps the gate; on the workers `gated_ppo_loss` hands it to verl's own `ppo_loss`. The loss is
run on a micro-batch in the exact layout verl's FSDP engine produces (jagged prompt+response sequences,
log-probs and entropies of a real nano model). The one replaced part is the Ray actor worker group, which
cannot be built without rollout GPUs: a recorder stands in for it and captures the batch verl would ship.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import import_verl

import_verl("verl")
import_verl("transfer_queue")

from tensordict import TensorDict  # noqa: E402
from transfer_queue import KVBatchMeta  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.utils.config import omega_conf_to_dataclass  # noqa: E402
from verl.workers.utils.losses import ppo_loss  # noqa: E402

from sirius_train.algorithms.entropy import EntropyGate, EntropyGateConfig  # noqa: E402
from sirius_train.algorithms.logprob import logprobs_and_entropy  # noqa: E402
from sirius_train.config import load_config  # noqa: E402
from sirius_train.local.model import NanoModelConfig, build_nano_model, train_tokenizer  # noqa: E402
from sirius_train.verl_backend import plan_run  # noqa: E402
from sirius_train.verl_backend.compose import compose_verl_config  # noqa: E402
from sirius_train.verl_backend.entropy import (  # noqa: E402
    GATE_STATE_FILE,
    GatedEntropyTrainer,
    load_gate_state,
    save_gate_state,
)
from sirius_train.verl_backend.gated_loss import ENTROPY_COEF_KEY, gated_ppo_loss  # noqa: E402

pytestmark = [pytest.mark.verl, pytest.mark.timeout(180)]
ROOT = Path(__file__).resolve().parents[1]
PROMPT_LENS, RESPONSE_LENS, ADVANTAGES = [5, 3, 7, 4], [6, 2, 9, 5], [1.0, -0.5, 0.3, -1.2]


@pytest.fixture(scope="module")
def verl_config():
    """verl's resolved config for nano stage 1 (adaptive gate: target 0.3, Δ 1e-3, c_max 0.01)."""
    cfg = load_config(ROOT / "configs" / "nano.yaml", ["backend=verl", "stages.0.entropy.coef=0.004"])
    return compose_verl_config(plan_run(cfg)[0].overrides)


@pytest.fixture(scope="module")
def actor_config(verl_config):
    return omega_conf_to_dataclass(verl_config.actor_rollout_ref.actor)  # as the trainer builds it


@pytest.fixture(scope="module")
def nano():
    tokenizer = train_tokenizer(["SELECT name FROM singer WHERE age > 30", "how many singers are there"] * 20, 300)
    config = NanoModelConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                             num_attention_heads=2, num_key_value_heads=2)
    return build_nano_model(config, tokenizer, seed=0), len(tokenizer)


def _micro_batch(nano, extra: dict) -> tuple[dict, TensorDict]:
    """(model_output, data) as verl's engine hands them to the loss: no padding, jagged along the sequence."""
    model, vocab = nano
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(5, vocab, (n,), generator=g) for n in PROMPT_LENS]
    responses = [torch.randint(5, vocab, (n,), generator=g) for n in RESPONSE_LENS]
    log_probs, entropies = [], []
    for p, r in zip(prompts, responses):
        ids = torch.cat([p, r])
        lp, h = logprobs_and_entropy(model(ids[None]).logits[0], torch.roll(ids, -1))  # position t predicts t+1
        log_probs.append(lp)
        entropies.append(h)
    offsets = torch.tensor([0] + [p + r for p, r in zip(PROMPT_LENS, RESPONSE_LENS)]).cumsum(0)
    model_output = {"log_probs": torch.nested.nested_tensor_from_jagged(torch.cat(log_probs), offsets),
                    "entropy": torch.nested.nested_tensor_from_jagged(torch.cat(entropies), offsets)}
    jagged = lambda ts: torch.nested.as_nested_tensor(ts, layout=torch.jagged)  # noqa: E731
    old = [lp[p - 1:p - 1 + r].detach() + 0.05 * torch.randn(r, generator=g)
           for lp, p, r in zip(log_probs, PROMPT_LENS, RESPONSE_LENS)]
    data = TensorDict({"prompts": jagged(prompts), "responses": jagged(responses),
                       "response_mask": jagged([torch.ones(r, dtype=torch.int64) for r in RESPONSE_LENS]),
                       "old_log_probs": jagged(old),
                       "advantages": jagged([torch.full((r,), a) for r, a in zip(RESPONSE_LENS, ADVANTAGES)])},
                      batch_size=[len(PROMPT_LENS)])
    tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=sum(RESPONSE_LENS), global_batch_size=len(PROMPT_LENS),
                         **extra)
    return model_output, data, entropies


def _response_entropy(entropies) -> torch.Tensor:
    """Token-mean entropy over the answer tokens (the H the bonus multiplies), computed independently."""
    return torch.cat([h[p - 1:p - 1 + r] for h, p, r in zip(entropies, PROMPT_LENS, RESPONSE_LENS)]).mean()


def _loss_and_grads(nano, actor_config, extra: dict):
    model = nano[0]
    model.zero_grad()
    out, data, entropies = _micro_batch(nano, extra)
    loss, metrics = gated_ppo_loss(actor_config, out, data)
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    return loss.detach(), grads, metrics, entropies


def test_gated_coefficient_is_the_entropy_term_of_verls_loss(nano, actor_config):
    assert actor_config.entropy_coeff == 0.0  # verl's own constant term is off; the gate supplies it
    c = 0.004
    base, base_grads, _, _ = _loss_and_grads(nano, actor_config, {ENTROPY_COEF_KEY: 0.0})
    gated, gated_grads, metrics, entropies = _loss_and_grads(nano, actor_config, {ENTROPY_COEF_KEY: c})
    entropy = _response_entropy(entropies)
    torch.testing.assert_close(gated, base - c * entropy.detach(), rtol=0, atol=1e-6)
    assert metrics["actor/entropy_loss"].aggregate() == pytest.approx(entropy.item(), abs=1e-5)
    # d(loss)/dθ changes by exactly −c·dH/dθ
    nano[0].zero_grad()
    _response_entropy(_micro_batch(nano, {})[2]).backward()
    for g0, g1, p in zip(base_grads, gated_grads, nano[0].parameters()):
        torch.testing.assert_close(g1, g0 - c * p.grad, rtol=1e-4, atol=1e-7)
    # no coefficient with the batch: verl's configured constant (0 here), i.e. verl's plain ppo_loss
    plain, _ = ppo_loss(actor_config, *_micro_batch(nano, {})[:2])
    torch.testing.assert_close(_loss_and_grads(nano, actor_config, {})[0], plain.detach(), rtol=0, atol=0)


class RecordingWorkerGroup:
    """Stands in for the Ray actor worker group: keeps what `update_actor` was sent, answers like verl's."""

    def __init__(self):
        self.sent: list[dict] = []

    def update_actor(self, batch: KVBatchMeta):
        self.sent.append(dict(batch.extra_info))
        return {"metrics": {"mfu": [0.5], "pg_loss": [0.1]}}


def _trainer(verl_config) -> GatedEntropyTrainer:
    """The registered trainer with the state `_update_actor` uses (Ray, rollouts and data are not started)."""
    trainer = object.__new__(GatedEntropyTrainer)
    e = verl_config.sirius.entropy
    trainer.gate = EntropyGate(EntropyGateConfig(mode="adaptive", target=e.target, delta=e.delta,
                                                 coef_max=e.coef_max, coef=e.coef))
    trainer.config = verl_config
    trainer.actor_rollout_wg = RecordingWorkerGroup()
    return trainer


def test_driver_sends_the_gate_coefficient_and_steps_the_gate(verl_config, nano, actor_config):
    trainer = _trainer(verl_config)
    target, delta = verl_config.sirius.entropy.target, verl_config.sirius.entropy.delta
    sent, coefs = [], []
    for entropy in (target - 0.1, target - 0.1, target + 0.2, target - 0.05):  # H_k measured under π_old
        metrics = {"actor/entropy": entropy}
        coefs.append(trainer.gate.coefficient())
        trainer._update_actor(KVBatchMeta(keys=["a"], tags=[{}], partition_id="train"), metrics)
        sent.append(trainer.actor_rollout_wg.sent[-1])
        assert metrics["actor/entropy_coef"] == coefs[-1]
        assert metrics["actor/entropy_gate_open"] == float(entropy < target)
        assert metrics["perf/mfu/actor"] == 0.5  # verl's own post-processing ran
    assert coefs == pytest.approx([0.004, 0.004 + delta, 0.004 + 2 * delta, 0.004 + delta])
    assert [s[ENTROPY_COEF_KEY] for s in sent] == pytest.approx([coefs[0], coefs[1], 0.0, coefs[3]])
    assert all(s["calculate_entropy"] for s in sent)  # verl computes H in the update's forward
    # what the driver sent is what verl's loss subtracts
    base, _, _, entropies = _loss_and_grads(nano, actor_config, {ENTROPY_COEF_KEY: 0.0})
    shipped, _, _, _ = _loss_and_grads(nano, actor_config, {ENTROPY_COEF_KEY: sent[1][ENTROPY_COEF_KEY]})
    torch.testing.assert_close(shipped, base - coefs[1] * _response_entropy(entropies).detach(), rtol=0, atol=1e-6)


def test_bypass_mode_without_entropy_is_a_clear_error(verl_config):
    with pytest.raises(RuntimeError, match="bypass_mode"):
        _trainer(verl_config)._update_actor(KVBatchMeta(keys=["a"], tags=[{}], partition_id="train"), {})


def test_gate_state_travels_with_the_checkpoint(tmp_path):
    gate = EntropyGate(EntropyGateConfig(target=0.2, delta=1e-3, coef_max=0.01))
    for _ in range(3):
        gate.update(0.1)
    save_gate_state(gate, tmp_path / "global_step_3")
    resumed = EntropyGate(EntropyGateConfig(target=0.2, delta=1e-3, coef_max=0.01))
    assert load_gate_state(resumed, tmp_path / "global_step_3")
    assert resumed.state_dict() == gate.state_dict() and resumed.coefficient() == pytest.approx(0.003)
    fresh = EntropyGate(EntropyGateConfig(target=0.2, delta=1e-3, coef_max=0.01))
    assert not load_gate_state(fresh, tmp_path / "global_step_9") and fresh.coefficient() == 0.0


def _fresh_python(code: str) -> list[str]:
    """The last line a new interpreter prints after `code`, in the environment translate gives Ray workers."""
    env = {k: v for k, v in os.environ.items() if k != "VERL_USE_EXTERNAL_MODULES"}
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.split("\n")[-2].split()


GATE_MODULE = "sirius_train.verl_backend.entropy"
REGISTERED = ("from verl.trainer.ppo.v1 import get_trainer_cls\n"
              "try:\n    registered = get_trainer_cls('sirius_dapo').__module__\n"
              "except Exception:\n    registered = None\n")


def test_the_entry_points_task_runner_registers_the_gate_and_nothing_else_does():
    # a process that imports verl, its main_ppo, our entry point and the pickled loss (an actor worker, a
    # vLLM server, the driver): our trainer module does not come with it, and nothing is registered
    worker = _fresh_python(
        "import pickle, sys\nfrom functools import partial\nimport verl, verl.trainer.main_ppo\n"
        "import sirius_train.verl_backend.main_ppo\n"
        "from sirius_train.verl_backend.gated_loss import gated_ppo_loss\n"
        "pickle.loads(pickle.dumps(partial(gated_ppo_loss, config=None)))\n" + REGISTERED +
        f"print('{GATE_MODULE}' in sys.modules, registered)")
    assert worker == ["False", "None"]
    # the TaskRunner process: building verl's TaskRunner (ours, as Ray builds the actor) registers the trainer
    runner = _fresh_python(
        "import sys\nfrom sirius_train.verl_backend.main_ppo import GatedTaskRunner\n"
        "GatedTaskRunner.__ray_actor_class__()\n" + REGISTERED +
        f"print('{GATE_MODULE}' in sys.modules, registered)")
    assert runner == ["True", GATE_MODULE]


def test_the_entry_point_hands_verl_our_task_runner():
    from verl.trainer.main_ppo import TaskRunnerV1

    from sirius_train.verl_backend.main_ppo import GatedTaskRunner

    assert issubclass(GatedTaskRunner.__ray_actor_class__, TaskRunnerV1.__ray_actor_class__)
    assert GatedTaskRunner.__ray_actor_class__.run is TaskRunnerV1.__ray_actor_class__.run  # verl's run, unchanged


class CheckpointingWorkerGroup(RecordingWorkerGroup):
    """Also answers verl's save/load calls, noting whether the gate's file was already beside the checkpoint."""

    def save_checkpoint(self, local_path, hdfs_path=None, global_step=0, max_ckpt_to_keep=None):
        Path(local_path).mkdir(parents=True)
        self.gate_file_before_actor_save = (Path(local_path).parent / GATE_STATE_FILE).is_file()
        self.latest_before_actor_save = (Path(local_path).parents[1] / "latest_checkpointed_iteration.txt").exists()

    def load_checkpoint(self, local_path, del_local_after_load=False):
        assert Path(local_path).is_dir()


class Loader:
    def state_dict(self):
        return {"position": 3}

    def load_state_dict(self, state):
        self.state = state


class NoCallback:
    def on_save(self, **kwargs):
        pass


def _checkpointing_trainer(verl_config, folder: Path) -> GatedEntropyTrainer:
    trainer = _trainer(verl_config)
    trainer.config = copy.deepcopy(verl_config)
    trainer.config.trainer.default_local_dir = str(folder)
    trainer.actor_rollout_wg = CheckpointingWorkerGroup()
    trainer.use_critic, trainer.trainer_mode = False, "sync"
    trainer.train_dataloader, trainer.checkpoint_callback = Loader(), NoCallback()
    return trainer


def test_gate_state_is_on_disk_before_verl_records_the_checkpoint(verl_config, tmp_path):
    trainer = _checkpointing_trainer(verl_config, tmp_path)
    for _ in range(3):
        trainer.gate.update(0.0)  # below the target: c_k grows
    trainer.global_steps = 3
    trainer._save_checkpoint()  # verl's own save, around the stand-in worker group
    wg = trainer.actor_rollout_wg
    assert wg.gate_file_before_actor_save and not wg.latest_before_actor_save
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() == "3"
    resumed = _checkpointing_trainer(verl_config, tmp_path)
    resumed._load_checkpoint()  # verl's own resume: latest_checkpointed_iteration.txt -> global_step_3
    assert resumed.global_steps == 3 and resumed.gate.state_dict() == trainer.gate.state_dict()
    (tmp_path / "global_step_3" / GATE_STATE_FILE).unlink()
    with pytest.raises(RuntimeError, match="silently restart"):
        _checkpointing_trainer(verl_config, tmp_path)._load_checkpoint()
