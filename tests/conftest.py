"""One torch thread in tests: per-sample learners are fastest that way and the suite does not
fight with itself (or with other processes) for the two cores."""

import pytest
import torch

from helpers import USER_MODULE

torch.set_num_threads(1)


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: needs a CUDA device; run only where torch sees "
                            "one (on a machine without, skipped saying so)")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device here (torch.cuda.is_available() is False)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="module")
def user_modules(tmp_path_factory):
    folder = tmp_path_factory.mktemp("user")
    (folder / "rt3_learners.py").write_text(USER_MODULE)
    (folder / "rt3_syntax.py").write_text("def broken(:\n    pass\n")
    (folder / "rt3_raises.py").write_text("x = 1 / 0\n")
    yield folder
    # their learners register themselves when a test loads one: not beyond this test file (an
    # error listing the registered methods in a later file would list them too)
    from ciosl.learners.registry import _REGISTRY

    for name in [n for n, c in _REGISTRY.items() if c.__module__.startswith("rt3_")]:
        del _REGISTRY[name]
