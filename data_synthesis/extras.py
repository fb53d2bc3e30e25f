"""Optional dependencies (vLLM, Ray, DeepSpeed, wandb, tensorboard): imported when a feature needs them.

A missing one is a `MissingExtra` error whose message names the feature, the install command of the
project extra that brings it, and what to use instead -- never an ImportError traceback from deep inside.
"""

from __future__ import annotations

import importlib


class MissingExtra(ImportError):
    """An optional dependency is not installed; the message names the extra that brings it."""


def require(module: str, extra: str, feature: str, instead: str = ""):
    """Import `module`, or raise `MissingExtra` naming `pip install 'sirius-sql[extra]'`.

    Example:
        >>> require("json", "none", "parsing").__name__
        'json'
        >>> try:
        ...     require("no_such_module_xyz", "vllm", "the vLLM sampler", "use the HF sampler")
        ... except MissingExtra as e:
        ...     print(e)
        the vLLM sampler needs no_such_module_xyz, which is not installed: pip install 'sirius-sql[vllm]' (or use the HF sampler)
    """
    try:
        return importlib.import_module(module)
    except ImportError as e:
        if e.name not in (module, module.split(".")[0]):
            raise  # the package is there but broken: its own error says more than ours would
        alternative = f" (or {instead})" if instead else ""
        raise MissingExtra(f"{feature} needs {module}, which is not installed: pip install 'sirius-sql[{extra}]'"
                           f"{alternative}") from None
