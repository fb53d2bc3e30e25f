"""Every public docstring example runs (sqlglot's habit: examples cannot rot), and every module imports."""

import doctest
import importlib
import pkgutil
import sys

import pytest
from conftest import import_verl, skippable_import_error

PACKAGES = ["rewards", "data_synthesis", "sirius_train"]


def _modules():
    for package in PACKAGES:
        pkg = importlib.import_module(package)
        yield package
        for info in pkgutil.walk_packages(pkg.__path__, prefix=package + "."):
            yield info.name


def _import(name: str):
    """The module, or a skip when it needs an optional extra that is not installed; a broken import fails."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        if not skippable_import_error(e):
            raise
        pytest.skip(f"{name}: {e}")


@pytest.mark.parametrize("name", sorted(set(_modules())))
def test_doctests(name):
    module = _import(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0


@pytest.fixture
def scratch_package(tmp_path, monkeypatch):
    """A package on sys.path whose modules the test writes."""
    (tmp_path / "scratch_pkg").mkdir()
    (tmp_path / "scratch_pkg" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path / "scratch_pkg"
    for name in [m for m in sys.modules if m.startswith("scratch_pkg")]:
        del sys.modules[name]


@pytest.mark.parametrize("line", ["from rewards.compare import no_such_name", "import rewards.no_such_module",
                                  "import verl.no_such_module"])
def test_a_broken_import_fails_instead_of_skipping(scratch_package, line):
    (scratch_package / "broken.py").write_text(line + "\n")
    try:
        _import("scratch_pkg.broken")
    except pytest.skip.Exception:  # a skip is an outcome pytest.raises would let through as "skipped"
        pytest.fail(f"a broken import ({line}) was skipped")
    except ImportError:
        return
    pytest.fail("the broken module imported")


def test_a_missing_optional_extra_skips_unless_ci_requires_it(scratch_package, monkeypatch):
    (scratch_package / "needs_extra.py").write_text("import vllm\n")
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here: no missing extra to show")
    with pytest.raises(pytest.skip.Exception):
        _import("scratch_pkg.needs_extra")
    monkeypatch.setenv("SIRIUS_REQUIRE_VERL", "1")
    with pytest.raises(ModuleNotFoundError):
        import_verl("sirius_no_such_verl_module")
    monkeypatch.delenv("SIRIUS_REQUIRE_VERL")
    with pytest.raises(pytest.skip.Exception):
        import_verl("sirius_no_such_verl_module")
