import importlib

import pytest


@pytest.mark.parametrize("name", ["rewards", "data_synthesis", "sirius_train"])
def test_top_level_packages_import(name):
    assert importlib.import_module(name).__doc__
