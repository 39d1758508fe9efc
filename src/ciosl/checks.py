"""Input checks that the data readers and the learners share (below both: ``data`` and
``learners`` import this, never each other for it)."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

MAX_FEATURE = 1e12  # larger feature magnitudes are refused (see Learner._check_Z)
WIDENED = ("bfloat16", "float16")  # torch dtypes read as float32 (exactly: float32 holds them)


def as_values(x: Any, where: str, what: str = "features") -> Any:
    """``x`` as the NumPy array of the values it holds, for a learner's ``where`` call, by two
    stated rules (docs/refused.md, "Odd arrays"):

    - a torch tensor is read as its values: detached from autograd (a learner never sends a
      gradient back into its inputs), copied to the CPU, bfloat16 and float16 widened to
      float32 (exact); a sparse tensor or one without data (the meta device) is refused;
    - a masked array is read as its data when nothing is masked, and refused when a value is
      (its raw value under the mask would be learned as if it were real).

    Anything else is returned as it is (for ``np.asarray``)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        if x.layout != torch.strided:
            raise ValueError(f"{where}: {what} are a sparse torch tensor ({x.layout}); pass "
                             "x.to_dense()")
        if x.device.type == "meta":
            raise ValueError(f"{where}: {what} are a torch tensor on the meta device, which "
                             "holds no values")
        x = x.detach()
        if x.device.type != "cpu":
            x = x.cpu()
        if str(x.dtype).removeprefix("torch.") in WIDENED:
            x = x.float()
        return x.numpy()
    if isinstance(x, np.ma.MaskedArray):
        mask = np.ma.getmaskarray(x)
        if mask.any():
            row = int(np.argwhere(mask)[0][0]) if mask.ndim > 1 or what == "labels" else 0
            raise ValueError(f"{where}: {what} are a masked array with {int(mask.sum())} "
                             f"masked value(s) (the first at position {row}); ciosl would "
                             "learn the values under the mask: fill them (x.filled(value)) "
                             "or drop those samples")
        return np.asarray(np.ma.getdata(x))
    return x


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
