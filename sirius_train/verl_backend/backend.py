"""`VerlBackend`: the schedule's DAPO stages run as verl jobs on a Ray cluster; the other phases run here.

Per stage: translate the run config (translate.py), check it against verl's own Hydra config
(compose.py), check every node's reward server and the stage's memory plan, launch verl's `main_ppo`
through our entry point (main_ppo.py, launch.py), merge the last FSDP checkpoint to an HF folder, and hand
that folder to the schedule, which re-estimates difficulty with it for stage 2.
Pass rates and held-out evaluation go through vLLM engines (the rollout's tensor-parallel size) fanned
out over Ray across the job's GPUs (`data_synthesis.ray_sampler`); a 32B model with HF `generate` on one
GPU does not fit. A multi-turn run's engines answer in episodes (`data_synthesis.turns`), the format it trains in. Building the base model and the SFT warm start reuse `LocalBackend`; the schedule
exchanges plain HF folders.
"""

from __future__ import annotations

import gc
import json
import os
import shlex
from dataclasses import dataclass
from pathlib import Path

from sirius_train.config import ConfigError, RunConfig, StageConfig
from sirius_train.progress import stderr
from sirius_train.run_folder import ensure_run_id, run_id
from sirius_train.verl_backend.launch import (
    latest_actor_checkpoint,
    merge_to_hf,
    prepend_path,
    prune_verl_checkpoints,
    run_logged,
    verl_command,
    verl_env,
)
from sirius_train.lora import LoraSpec
from sirius_train.verl_backend.memory import estimation_plan, stage_layout, stage_plans
from sirius_train.verl_backend.plans import (
    DEFAULT_GPU_GIB,
    ENGINE_CALL_SEQUENCES,
    estimation_engine,
    model_shape,
    require_fit,
    require_positions,
)
from sirius_train.verl_backend.translate import StagePaths, engine_context_length, stage_overrides, tool_config

PROJECT_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class StagePlan:
    """Everything needed to launch one stage, and to show it in a dry run."""

    name: str
    paths: StagePaths
    overrides: list[str]
    argv: list[str]
    tool_config: dict | None = None  # multi-turn: verl's tool config, written to `paths.tool_config`

    def shell(self) -> str:
        return shlex.join(self.argv)


def reward_function(cfg: RunConfig) -> Path:
    """The file verl loads `compute_score` from: the execution reward, which reads a multi-turn episode's answer
    from the model's own turns (`verl_backend/episode_reward.py`) as the local backend does."""
    if cfg.rollout.multi_turn.enabled:
        return PROJECT_ROOT / "sirius_train" / "verl_backend" / "episode_reward.py"
    return PROJECT_ROOT / "rewards" / "verl_reward.py"


def verl_checkpoint_root(cfg: RunConfig) -> Path:
    """This run's folder under `verl.checkpoint_dir`: its name and its run id (`run_folder.run_id`; "new" before
    the run folder is first claimed, as in a dry run), so verl (resume_mode=auto) only ever resumes its own."""
    return Path(cfg.verl.checkpoint_dir) / f"{cfg.name}-{run_id(cfg.run_dir) or 'new'}"


def plan_stage(cfg: RunConfig, index: int, stage: StageConfig, curriculum: Path, init: Path, stage_dir: Path,
               eval_parquet: Path) -> StagePlan:
    """The verl command for stage `index` (1-based); every path absolute, since Ray workers run elsewhere."""
    checkpoints = (verl_checkpoint_root(cfg) / f"stage{index}" if cfg.verl.checkpoint_dir
                   else stage_dir / "verl_checkpoints")
    paths = StagePaths(
        train_files=str(curriculum.resolve()), val_files=str(eval_parquet.resolve()), model=str(init.resolve()),
        checkpoints=str(checkpoints.resolve()), reward_fn=str(reward_function(cfg)),
        db_root=str(Path(cfg.data.db_root).resolve()),
        pythonpath=prepend_path(str(PROJECT_ROOT), os.environ.get("PYTHONPATH")),
        metrics=str((stage_dir / "verl_metrics.jsonl").resolve()),
        tool_config=str((stage_dir / "sql_tool.yaml").resolve()))
    overrides = stage_overrides(cfg, index, stage, paths)
    mt = cfg.rollout.multi_turn
    tools = tool_config(mt, paths.db_root, stage.max_new_tokens, cfg.reward.url) if mt.enabled else None
    return StagePlan(stage.name, paths, overrides, verl_command(cfg.verl.python, overrides), tools)


def plan_run(cfg: RunConfig) -> list[StagePlan]:
    """Each stage's plan at the paths the schedule will use (for `--dry-run`: nothing needs to exist yet)."""
    run_dir = cfg.run_dir
    if cfg.model.path:
        init = Path(cfg.model.path)
    else:
        init = run_dir / ("sft" if cfg.sft.enabled else "base") / "model"
    plans = []
    for index, stage in enumerate(cfg.stages, start=1):
        stage_dir = run_dir / f"stage{index}"
        plans.append(plan_stage(cfg, index, stage, stage_dir / "curriculum.parquet", init, stage_dir,
                                eval_parquet_path(cfg)))
        init = stage_dir / "model"
    return plans


def eval_parquet_path(cfg: RunConfig) -> Path:
    return cfg.run_dir / "data" / "eval.parquet"


class VerlBackend:
    """The `Backend` of `sirius_train.schedule` on verl."""

    def __init__(self, cfg: RunConfig):
        if cfg.verl.device == "cpu":
            _enter_cpu_platform()  # before Ray is imported: it reads its address setting once
        try:
            import verl  # noqa: F401
        except ImportError:
            raise ConfigError("backend=verl needs verl installed: pip install -e '.[verl]' (verl 0.9.1, Ray, "
                              "TransferQueue; vLLM or SGLang for rollouts on the GPU nodes)") from None
        from sirius_train.local.backend import LocalBackend

        require_positions(cfg)  # before the warm start: the nano model's, or model.path's
        self.cfg = cfg
        self.local = LocalBackend(cfg)
        self._engines: tuple[str, object] | None = None  # (model, RaySampler): kept from an evaluation to the
        # next stage's pass rates, which use the same model; one max_model_len (the longest stage) for both

    # Building the base model and the SFT warm start run here, exactly as on the local backend.
    def prepare_base(self, data, out: Path) -> Path:
        return self.local.prepare_base(data, out)

    def sft(self, data, init: Path, out: Path):
        return self.local.sft(data, init, out)

    def pass_rates(self, examples, model: Path, stage: StageConfig, data, out: Path):
        """Pass rates through vLLM engines on the job's GPUs; the sampler stays up for the curriculum's gap filling."""
        from data_synthesis.difficulty import estimate_pass_rates, prompt_for
        from data_synthesis.ray_sampler import estimate_calls
        from sirius_train.halts import preemptible
        from sirius_train.progress import progress_bar

        per_call = max(1, ENGINE_CALL_SEQUENCES // stage.estimate_k)
        sampling = {"temperature": stage.temperature, "top_p": stage.top_p, "max_new_tokens": stage.max_new_tokens}
        options = {"batch_size": per_call, "compare": data.compare, "timeout_s": self.cfg.reward.timeout_s,
                   "variants": self.cfg.reward.variants, "policy": str(model), "prompt_format": data.prompt_format,
                   **sampling}
        cache, limits = out / "passrates.cache.jsonl", self.local.multi_turn[0] if self.local.multi_turn else None
        on_demand = _EnginesOnDemand(self, model, stage.name, limits)
        try:  # a resumed stage: every rate may be in the cache already, and engines cost minutes of the job
            rates = estimate_pass_rates(examples, on_demand.cache_only(), data.db_root, k=stage.estimate_k,
                                        cache_path=cache, seed=self.cfg.seed, **options)
            stderr.print(f"pass rates ({stage.name}): all {len(examples)} read from {cache}; no engine started")
            return rates, on_demand, options
        except _NotCached:
            pass
        sampler = self._sampler(model, stage.name)
        prompts = [prompt_for(e, data.db_root, data.prompt_format) for e in examples]
        db_ids = [e.db_id for e in examples] if sampler.multi_turn else None  # episodes probe their databases
        sampler.expect(estimate_calls(prompts, stage.estimate_k, batch_size=per_call, seed=self.cfg.seed,
                                      db_ids=db_ids, **sampling))
        with progress_bar(f"pass rates ({stage.name}, k={stage.estimate_k}, vLLM)", len(examples)) as advance:
            rates = estimate_pass_rates(
                examples, sampler, data.db_root, k=stage.estimate_k, cache_path=cache,
                seed=self.cfg.seed, **options,
                progress=preemptible(advance, f"{stage.name}: pass rates stopped, the finished ones cached"))
        return rates, sampler, options

    def evaluate(self, model: Path, data, stage: str) -> dict:
        """Greedy answers to the held-out set through the same vLLM engines, scored like the reward; episodes in a
        multi-turn run, with the local backend's `eval_turns_mean` and `eval_probe_share`."""
        from data_synthesis.interaction import episode_answer, observation_spans
        from data_synthesis.ray_sampler import estimate_calls
        from sirius_train.local.evaluate import score_answers
        from sirius_train.progress import progress_bar

        max_new = max(s.max_new_tokens for s in self.cfg.stages)
        items = self.local._eval_items(data)
        sampler = self._sampler(model, stage)
        db_ids = [it.db_id for it in items] if sampler.multi_turn else None
        calls = estimate_calls([it.prompt for it in items], 1, batch_size=ENGINE_CALL_SEQUENCES, seed=self.cfg.seed,
                               temperature=0.0, top_p=1.0, max_new_tokens=max_new, db_ids=db_ids)
        sampler.expect(calls)
        texts = []
        with progress_bar(f"evaluation ({stage}, vLLM)", len(items)) as advance:
            for prompts, n, options in calls:
                texts += [answers[0] for answers in sampler.sample(prompts, n, **options)]
                advance(len(prompts))
        preds = [episode_answer(t) for t in texts] if sampler.multi_turn else None  # the model's turns only
        figures = score_answers(items, texts, self.local.eval_executor, compare=data.compare, preds=preds)
        if sampler.multi_turn:  # probes run = observations in the episode
            probes = [len(observation_spans(t)) for t in texts]
            figures.update({"eval_turns_mean": sum(probes) / len(probes),
                            "eval_probe_share": sum(p > 0 for p in probes) / len(probes)})
        self.local.metrics.log({"stage": stage, "step": -1, "eval": "final", **figures})
        return figures

    def train_stage(self, index: int, stage: StageConfig, curriculum: Path, init: Path, data, out: Path) -> Path:
        """Launch verl on the curriculum, wait, merge its last checkpoint; returns the HF folder `out/model`."""
        from omegaconf import OmegaConf

        from data_synthesis.export import write_verl_parquet
        from sirius_train.progress import progress_bar
        from sirius_train.verl_backend.compose import compose_verl_config

        model_dir = out / "model"
        if (model_dir / "config.json").is_file():  # merged before an interruption, maybe before its metrics came in
            if not any(r.get("stage") == stage.name and r.get("backend") == "verl" for r in self.local.metrics.rows()):
                self._import_metrics(out / "verl_metrics.jsonl", stage.name)
            return model_dir
        _check_rows(curriculum, stage)
        eval_parquet = eval_parquet_path(self.cfg)
        if not eval_parquet.is_file():
            write_verl_parquet(data.eval_set, eval_parquet, data.db_root, compare=data.compare,
                               prompt_format=data.prompt_format)
        if self.local.multi_turn is not None:
            require_prompt_room([curriculum, eval_parquet], init, self.local.multi_turn[0],
                                self.cfg.verl.max_prompt_length)
        ensure_run_id(self.cfg.run_dir)  # claimed runs have one; a backend driven directly gets it here
        plan = plan_stage(self.cfg, index, stage, curriculum, init, out, eval_parquet)
        resolved = compose_verl_config(plan.overrides, plan.tool_config)  # a bad key fails here, not on the cluster
        out.mkdir(parents=True, exist_ok=True)
        (out / "verl_config.yaml").write_text(OmegaConf.to_yaml(resolved))
        if plan.tool_config:
            Path(plan.paths.tool_config).write_text(OmegaConf.to_yaml(OmegaConf.create(plan.tool_config)))
        (out / "verl_command.sh").write_text(plan.shell() + "\n")
        require_positions(self.cfg, init)
        self._require_fit(init, f"stage {stage.name!r} (verl)",
                          lambda shape, gib: stage_plans(shape, stage_layout(self.cfg, stage, gib)))
        self._close_engines()
        self._free_gpu()
        env = verl_env(plan.paths.pythonpath, self.cfg.verl.ray_address, self.cfg.verl.device)
        self._check_reward_servers(env.get("RAY_ADDRESS"), plan.paths.pythonpath)
        _rotate(Path(plan.paths.metrics))
        stderr.print(f"[bold]verl[/] {stage.name}: {self.cfg.verl.nnodes}x{self.cfg.verl.n_gpus_per_node} GPUs, "
                     f"log {out / 'verl.log'}")
        with progress_bar(f"DAPO {stage.name} (verl)", stage.steps) as advance:
            done = [0]

            def on_step(step: int) -> None:
                if step > done[0]:
                    advance(step - done[0])
                    done[0] = step

            checkpoints, keep = Path(plan.paths.checkpoints), self.cfg.verl.keep_checkpoints
            if checkpoints.is_dir():  # a relaunch: only the resume point stays, verl keeps `keep` of its own saves
                prune_verl_checkpoints(checkpoints, min(1, keep))
            try:
                run_logged(plan.argv, env, out / "verl.log", on_step=on_step, checkpoints=checkpoints)
            finally:
                if checkpoints.is_dir():
                    prune_verl_checkpoints(checkpoints, keep)
        actor = latest_actor_checkpoint(Path(plan.paths.checkpoints))
        spec = LoraSpec.of(self.cfg.model)  # LoRA: the checkpoint holds adapters, folded into the stage's start
        merge_to_hf(self.cfg.verl.python, actor, model_dir, env, out / "merge.log", lora=spec and (spec, init))
        self._import_metrics(Path(plan.paths.metrics), stage.name)
        return model_dir

    def close(self) -> None:
        self._close_engines()
        self.local.close()

    def _sampler(self, model: Path, phase: str):
        """vLLM engines serving `model` on every GPU of the job, started once and kept for the next phase."""
        if self._engines is not None and self._engines[0] == str(model):
            return self._engines[1]
        self._close_engines()
        self._free_gpu()
        require_positions(self.cfg, model)
        self._require_fit(model, f"{phase}: vLLM pass rates / evaluation",
                          lambda shape, gib: [estimation_plan(self.cfg, shape, gib)])
        limits = self.local.multi_turn[0] if self.local.multi_turn else None
        self._engines = (str(model), start_engines(self.cfg, model, engine_context_length(self.cfg), limits))
        return self._engines[1]

    def _close_engines(self) -> None:
        """Stop the vLLM actors (verl needs the GPUs) and this process's Ray connection."""
        if self._engines is not None:
            self._engines[1].close()
            self._engines = None
            import ray

            if ray.is_initialized():
                ray.shutdown()

    def _require_fit(self, model: Path, what: str, plans) -> None:
        """Refuse a phase whose memory plan does not fit this node's GPUs (or 80 GiB when none is visible here)."""
        found = model_shape(self.cfg, model)
        if found is None:
            stderr.print(f"[yellow]warning:[/] {what}: no config.json in {model}; memory plan not checked")
            return
        require_fit(plans(found[1], _gpu_gib()), what)

    def _check_reward_servers(self, ray_address: str | None, pythonpath: str) -> None:
        """Every node's reward server must be ours and serve `data.db_root`, before verl starts."""
        if not self.cfg.reward.url:
            return
        from sirius_train.verl_backend.reward_check import reward_server_problems

        problems = reward_server_problems(self.cfg.reward.urls(), str(Path(self.cfg.data.db_root).resolve()),
                                          ray_address, pythonpath)
        if problems:
            raise ConfigError("reward server check failed before launching verl: " + "; ".join(problems))

    def _free_gpu(self) -> None:
        """verl and vLLM need every GPU of this node: move off the GPU the model LocalBackend keeps after SFT."""
        import torch

        if self.local._loaded is not None:  # LocalBackend has no public unload
            self.local._loaded[1].to("cpu")
            self.local._loaded = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def _import_metrics(self, path: Path, stage: str) -> None:
        """verl's per-step metrics into `runs/<name>/metrics.jsonl` (later launches of a step win)."""
        by_step: dict[int, dict] = {}
        for part in sorted(path.parent.glob(path.name + ".*")) + [path]:
            if part.is_file():
                for line in part.read_text().splitlines():
                    row = json.loads(line)
                    by_step[row["step"]] = row["data"]
        for step in sorted(by_step):
            self.local.metrics.log({"stage": stage, "step": step, "backend": "verl", **by_step[step]})


class _NotCached(Exception):
    """A pass rate the cache does not hold: the engines have to start."""


class _EnginesOnDemand:
    """The sampler of a stage whose pool rates all came from the cache: vLLM engines start on the first request
    (gap filling's), not before. `cache_only()` is the sampler that finds out, sampling nothing."""

    def __init__(self, backend: "VerlBackend", model: Path, phase: str, limits):
        self._backend, self._model, self._phase = backend, model, phase
        self.multi_turn, self.limits = limits is not None, limits

    def sample(self, *args, **kwargs):
        return self._backend._sampler(self._model, self._phase).sample(*args, **kwargs)

    def cache_only(self):
        class CacheOnly:
            multi_turn, limits = self.multi_turn, self.limits

            def sample(self, *args, **kwargs):
                raise _NotCached

        return CacheOnly()


def engine_factory(cfg: RunConfig, model: Path, max_model_len: int):
    """(a picklable `VLLMSampler` factory, actors, GPUs per actor) for pass rates and evaluation (pure)."""
    from functools import partial

    from data_synthesis.vllm_sampler import VLLMSampler

    v, engine = cfg.verl, estimation_engine(cfg)
    options = {"distributed_executor_backend": "mp"} if engine.tensor_parallel > 1 else {}  # TP inside one actor
    make = partial(VLLMSampler, str(Path(model).resolve()), tensor_parallel_size=engine.tensor_parallel,
                   gpu_memory_utilization=engine.gpu_memory_utilization, max_model_len=max_model_len,
                   max_num_batched_tokens=v.max_num_batched_tokens, enforce_eager=v.enforce_eager, seed=cfg.seed,
                   **options)
    return make, engine.actors, engine.tensor_parallel


def start_engines(cfg: RunConfig, model: Path, max_model_len: int, limits=None):
    """A `RaySampler` of `VLLMSampler`s, one per `rollout_tp` GPUs of the job, in the cluster verl will use. With
    `limits` (a multi-turn run's `ProbeLimits`) each answers in episodes (`turns.TurnEpisodeSampler`), probing where
    the rollout's SQL tool probes: the reward servers, else the sandbox on `data.db_root`."""
    from functools import partial

    import ray

    from data_synthesis.ray_sampler import RaySampler, init_ray

    if not ray.is_initialized():
        env = verl_env(prepend_path(str(PROJECT_ROOT), os.environ.get("PYTHONPATH")), cfg.verl.ray_address,
                       cfg.verl.device)
        # on a CPU machine the engines hold logical GPUs, as verl's workers do (`verl.device: cpu`)
        logical = {"num_gpus": cfg.verl.n_gpus_per_node} if cfg.verl.device == "cpu" else {}
        init_ray(ray, address=env.get("RAY_ADDRESS"), logging_level="ERROR",
                      runtime_env={"env_vars": {"PYTHONPATH": env["PYTHONPATH"]}}, **logical)
    make, actors, gpus = engine_factory(cfg, model, max_model_len)
    if limits is not None:
        from data_synthesis.turns import episode_sampler

        make = partial(episode_sampler, make, limits, str(Path(cfg.data.db_root).resolve()), cfg.reward.url)
    stderr.print(f"[bold]pass rates / evaluation[/]: {estimation_engine(cfg).describe()}"
                 + (", multi-turn episodes" if limits is not None else ""))
    return RaySampler(make, actors, num_gpus=gpus, limits=limits)


def _enter_cpu_platform() -> None:
    """`verl.device: cpu`: refuse where an accelerator is visible, else set the CPU platform's environment in this
    process (verl's config checks, Ray for the vLLM engines) and, through `verl_env`, in verl's."""
    from sirius_train.verl_backend.cpu_platform import accelerator_visible, activate, cpu_env, vllm_cpu_build

    if found := accelerator_visible():
        raise ConfigError(f"verl.device=cpu, but this machine has a {found}: the CPU platform is for machines "
                          "without an accelerator; remove verl.device (it defaults to cuda)")
    if vllm_cpu_build() is None:
        raise ConfigError("verl.device=cpu needs vLLM's CPU build recorded as the `vllm` distribution with a +cpu "
                          "version: scripts/verl_cpu_venv.sh builds that environment (make test-verl-cpu)")
    for key, value in cpu_env().items():
        os.environ.setdefault(key, value)
    activate()


def _gpu_gib() -> float:
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(0).total_memory / 2**30
    return DEFAULT_GPU_GIB


def require_prompt_room(parquets: list[Path], model: Path, limits, max_prompt_length: int) -> None:
    """A multi-turn stage's prompts must fit `verl.max_prompt_length` with the probe instructions: verl's filter
    measures a row without them (our agent loop adds them later), and a prompt past the limit would be cut from the
    left (the loop refuses it mid-run instead). Rows too long even without them are verl's filter's to drop."""
    import pyarrow.parquet as pq

    from data_synthesis.checkpoints import load_tokenizer
    from data_synthesis.interaction import with_probe_instructions
    from data_synthesis.prompts import chat_text

    tokenizer = load_tokenizer(model)

    def tokens(messages: list[dict]) -> int:
        return len(tokenizer(chat_text(tokenizer, messages), add_special_tokens=False)["input_ids"])

    for parquet in parquets:
        prompts = [[{"role": m["role"], "content": m["content"]} for m in p]
                   for p in pq.read_table(parquet, columns=["prompt"]).column("prompt").to_pylist()]
        cut = [full for p in prompts if tokens(p) <= max_prompt_length
               and (full := tokens(with_probe_instructions(p, limits))) > max_prompt_length]
        if cut:
            raise ConfigError(f"{len(cut)} of {len(prompts)} prompts of {parquet} fit verl.max_prompt_length="
                              f"{max_prompt_length} only without the probe instructions (up to {max(cut)} tokens "
                              f"with them): verl's filter would keep them and its rollout cut them from the left; "
                              f"raise verl.max_prompt_length to {max(cut)} or more")


def _check_rows(curriculum: Path, stage: StageConfig) -> None:
    import pyarrow.parquet as pq

    rows = pq.read_metadata(curriculum).num_rows
    if rows < stage.prompts_per_step:
        raise ConfigError(f"{curriculum} has {rows} prompts but stage {stage.name!r} has prompts_per_step="
                          f"{stage.prompts_per_step}: verl drops incomplete batches, so nothing would train; "
                          "raise the stage budget or lower prompts_per_step")


def _rotate(metrics: Path) -> None:
    """verl's file logger truncates its file: keep an earlier launch's rows as `<name>.<n>`."""
    if metrics.is_file():
        n = len(list(metrics.parent.glob(metrics.name + ".*")))
        metrics.rename(metrics.with_name(f"{metrics.name}.{n:03d}"))
