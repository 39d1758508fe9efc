"""One torch thread in tests: per-sample learners are fastest that way and the suite does not
fight with itself (or with other processes) for the two cores."""

import pytest
import torch

from helpers import USER_MODULE

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def user_modules(tmp_path_factory):
    folder = tmp_path_factory.mktemp("user")
    (folder / "rt3_learners.py").write_text(USER_MODULE)
    (folder / "rt3_syntax.py").write_text("def broken(:\n    pass\n")
    (folder / "rt3_raises.py").write_text("x = 1 / 0\n")
    return folder
