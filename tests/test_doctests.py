"""Every public docstring example runs (sqlglot's habit: examples cannot rot)."""

import doctest
import importlib
import pkgutil

import pytest

PACKAGES = ["rewards", "data_synthesis", "sirius_train"]


def _modules():
    for package in PACKAGES:
        pkg = importlib.import_module(package)
        yield package
        for info in pkgutil.walk_packages(pkg.__path__, prefix=package + "."):
            yield info.name


@pytest.mark.parametrize("name", sorted(set(_modules())))
def test_doctests(name):
    try:
        module = importlib.import_module(name)
    except ImportError as e:  # optional extras (vllm, deepspeed...) may be absent
        pytest.skip(f"{name}: {e}")
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0
