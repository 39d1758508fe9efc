"""Input checks that the data readers and the learners share (below both: ``data`` and
``learners`` import this, never each other for it)."""

from __future__ import annotations

import numpy as np

MAX_FEATURE = 1e12  # larger feature magnitudes are refused (see Learner._check_Z)


def bad_feature(Z: np.ndarray) -> tuple[int, str] | None:
    """The first row of the real 2-d array ``Z`` holding a value a learner refuses, and what is
    wrong with it (``"has NaN or infinite features"``, ``"has feature 3 = 1e+39, too large
    ..."``), or None. Feature files use it too, to name the file and the row."""
    if Z.size and Z.max() <= MAX_FEATURE and Z.min() >= -MAX_FEATURE:  # no temporary when all
        return None  # is well (NaN fails it)
    finite = np.isfinite(Z).all(axis=1)
    big = ~(np.abs(np.where(np.isfinite(Z), Z, 0)) <= MAX_FEATURE).all(axis=1)
    bad = ~finite | big
    if not bad.any():
        return None
    row = int(np.argmax(bad))
    if not finite[row]:
        return row, "has NaN or infinite features"
    col = int(np.argmax(np.abs(Z[row]) > MAX_FEATURE))
    return row, (f"has feature {col} = {float(Z[row, col]):.3g}, beyond +-{MAX_FEATURE:.0e}: "
                 "too large (its square overflows float32 arithmetic, and it would swamp every "
                 "running mean for good); rescale the features")
