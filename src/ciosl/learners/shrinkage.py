"""Shrinkage of a covariance estimated from running statistics (SLDA, RP-LDA): a fixed
coefficient, or OAS chosen from the statistics themselves (no stored samples)."""

from __future__ import annotations

import inspect

SHRINKAGE_ESTIMATORS = ("fixed", "oas")


def oas_shrinkage(trace: float, frob2: float, n: int, d: int) -> float:
    """OAS coefficient a of the covariance Sigma = S / n from tr S, ||S||_F^2, the sample
    count n and the width d: scikit-learn's ``OAS(assume_centered=True)`` formula, term for
    term (a = 0 at d = 1, 1 when its denominator vanishes)."""
    if d == 1:
        return 0.0
    alpha = frob2 / (n * n * d * d)  # mean(Sigma ** 2)
    mu2 = (trace / (n * d)) ** 2  # (tr Sigma / d) ** 2
    den = (n + 1) * (alpha - mu2 / d)
    return 1.0 if den == 0 else min((alpha + mu2) / den, 1.0)


def check_shrinkage(learner) -> None:
    """Refuse a ``shrinkage`` that would be ignored: one set away from its default while
    ``shrinkage_estimator`` chooses it."""
    default = inspect.signature(type(learner).__init__).parameters["shrinkage"].default
    if learner.shrinkage_estimator != "fixed" and learner.shrinkage != default:
        raise ValueError(f"{learner.name}: shrinkage={learner.shrinkage} is used only with "
                         f"shrinkage_estimator=fixed (now {learner.shrinkage_estimator!r}, "
                         "which chooses the shrinkage itself)")


def shrunk_terms(trace: float, frob2: float, n: int, d: int, eps: float,
                 estimator: str) -> tuple[float, float, float]:
    """(a, r, chosen): a S + r I is the shrunk covariance of Sigma = S / n, S the (d, d)
    within-class scatter of n samples given by its trace and squared Frobenius norm, and
    ``chosen`` the shrinkage coefficient used. "fixed": (1 - eps) Sigma + eps I. "oas":
    (1 - c) Sigma + c (tr Sigma / d) I, c = ``oas_shrinkage``; I (nearest class mean) while
    tr S = 0 (no spread seen yet)."""
    n = max(n, 1)
    if estimator == "fixed":
        return (1 - eps) / n, eps, eps
    if trace <= 0:
        return 0.0, 1.0, 1.0
    c = oas_shrinkage(trace, frob2, n, d)
    return (1 - c) / n, c * trace / (n * d), c


def held_ridge(rho: float, n: int, trace: float, d: int, estimator: str) -> tuple[float, float]:
    """(a, chosen) for a ridge rho held between refits: a S + r I = a (S + rho I) is the
    shrunk covariance of ``shrunk_terms`` whose coefficient ``chosen`` gives r / a = rho for
    the scatter S of n samples with trace ``trace`` now. "fixed": (1 - e) S / n + e I,
    e = rho / (rho + n); "oas": (1 - c) S / n + c (tr S / (n d)) I, c = rho d / (rho d + tr S).
    The answer is then exactly LDA with that coefficient."""
    n = max(n, 1)
    e = rho / (rho + n) if estimator == "fixed" else rho * d / (rho * d + trace)
    return (1 - e) / n, e
