"""One torch thread in tests: per-sample learners are fastest that way and the suite does not
fight with itself (or with other processes) for the two cores."""

import torch

torch.set_num_threads(1)
