"""Helpers shared by several test files: the ``ciosl`` command in-process (``cli``,
``run_args``, ``grid_file``, ``one_line_error``), small trained learners (``trained``,
``snapshot``), damaged files (``flip``, ``member_span``, ``zip_bomb``), learners of the
user's own (``USER_MODULE``, ``own_learner``) and the baselines' data (``class_blobs``,
``mixture``, ``class_by_class``, ``hidden``)."""

from __future__ import annotations

import errno
import io
import os
import uuid
import zipfile
from pathlib import Path

import numpy as np
import torch

from ciosl import conformance
from ciosl.cli import main
from ciosl.evaluation import experiment

QUICK = ["--dataset", "digits", "--ordering", "class_iid", "--limit-per-class", "12",
         "--offline-epochs", "2", "--quiet"]


PROTOCOL = "limit_per_class=12+offline_epochs=2"  # QUICK's options, in the result's name


def cli(capsys, argv: list[str]) -> tuple[int, str]:
    rc = main(argv)
    return rc, capsys.readouterr().err




def fail_with(error: BaseException):
    def raiser(*a, **kw):
        raise error
    return raiser


def interrupt_second_run(monkeypatch) -> list[int]:
    """Make the second ``run_seed`` of a ``ciosl run`` raise KeyboardInterrupt (Ctrl-C); the
    list counts the calls."""
    real, calls = experiment.run_seed, []

    def interrupted_second(*a, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*a, **kw)

    monkeypatch.setattr(experiment, "run_seed", interrupted_second)
    return calls


D = 6


def zip_bomb(inner: str) -> bytes:
    import io
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr(inner, bytes(80 << 20))  # 80 MB of zeros: ~80 KB deflated
    return buf.getvalue()


NAME = "digits_class_iid_ncm_limit_per_class=12+offline_epochs=2.json"  # QUICK's ncm result


def run_args(tmp: Path, *extra: str, method: str = "ncm", out: str = "out") -> list[str]:
    return ["run", *QUICK, "--method", method, "--cache", str(tmp / "cache"),
            "--out", str(tmp / out), *extra]


def grid_file(tmp: Path, body: str, name: str = "grid.toml") -> str:
    path = tmp / name
    path.write_text(f'out = "{tmp}/out"\ncache = "{tmp}/cache"\ndatasets = ["digits"]\n'
                    f'orderings = ["class_iid"]\nlimit_per_class = 12\n{body}\n')
    return str(path)




def full_disk(monkeypatch, folder: Path, spare: tuple[str, ...] = ()) -> None:
    """Make every ``os.write`` and ``os.fsync`` of a file under ``folder`` fail as on a full
    disk (``ENOSPC`` with no file name, as the kernel reports it), except files whose path
    holds one of ``spare``. ``fsync`` is where a buffered write's full disk shows."""
    real_write, real_fsync = os.write, os.fsync

    def full(fd: int) -> bool:
        try:
            where = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return False
        return where.startswith(str(folder)) and not any(s in where for s in spare)

    def write(fd, data):
        if full(fd):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    def fsync(fd):
        if full(fd):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_fsync(fd)

    monkeypatch.setattr(os, "write", write)
    monkeypatch.setattr(os, "fsync", fsync)


def make_fifo(tmp: Path, name: str) -> Path:
    path = tmp / name
    os.mkfifo(path)
    return path


def one_line_error(rc: int, err: str) -> str:
    assert rc == 2, err
    assert "Traceback" not in err and "internal error" not in err, err
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


def snapshot(learner) -> bytes:
    buf = io.BytesIO()
    torch.save(learner.state_dict(), buf)
    return buf.getvalue()


def trained(method: str, **settings):
    from ciosl.learners import make_learner

    rng = np.random.default_rng(0)
    learner = make_learner(method, **settings)
    Z = rng.normal(size=(40, D)).astype(np.float32) + np.repeat(np.eye(2, D) * 4, 20, axis=0)
    learner.fit_base(Z, [0] * 20 + [1] * 20)
    for i in range(6):
        learner.learn_one(rng.normal(size=D) + 4 * np.eye(D)[i % 2], i % 2)
    return learner


USER_MODULE = '''
import sys

import numpy as np
import torch

from ciosl.learners.base import Learner


class Means(Learner):
    """Nearest class mean: a well-behaved learner of the user's own; the others break it."""

    name = "rt3-means"
    description = "nearest class mean"
    help = {"seed": "unused"}

    def __init__(self, *, seed: int = 0):
        super().__init__(seed=seed)

    def _init_state(self, dim):
        self.sums = torch.zeros(0, dim, dtype=torch.float64)
        self.counts = torch.zeros(0, dtype=torch.float64)

    def _add_class(self):
        self.sums = torch.cat([self.sums, torch.zeros(1, self.sums.shape[1],
                                                      dtype=torch.float64)])
        self.counts = torch.cat([self.counts, torch.zeros(1, dtype=torch.float64)])

    def _fit_base(self, Z, yi):
        for z, k in zip(Z, yi):
            self.sums[k] += torch.as_tensor(z, dtype=torch.float64)
            self.counts[k] += 1

    def _learn_one(self, z, yi):
        self.sums[yi] += torch.as_tensor(z, dtype=torch.float64)
        self.counts[yi] += 1

    def _predict_proba(self, Z):
        mu = (self.sums / self.counts.clamp(min=1)[:, None]).numpy()
        d = ((np.asarray(Z, np.float64)[:, None, :] - mu[None]) ** 2).sum(-1)
        e = np.exp(-(d - d.min(axis=1, keepdims=True)))
        return e / e.sum(axis=1, keepdims=True)

    def _state(self):
        return {"sums": self.sums.clone(), "counts": self.counts.clone()}

    def _load_state(self, state):
        self.sums, self.counts = state["sums"].clone(), state["counts"].clone()


class NaNs(Means):
    name = "rt3-nan"

    def _predict_proba(self, Z):
        return np.full((len(Z), len(self.classes_)), np.nan)


class ExtraColumn(Means):
    name = "rt3-columns"

    def _predict_proba(self, Z):
        P = super()._predict_proba(Z)
        return np.concatenate([P, np.zeros((len(Z), 1))], axis=1)


class MissingRow(Means):
    name = "rt3-rows"

    def _predict_proba(self, Z):
        return super()._predict_proba(Z)[1:]


class OwnProbaNaN(Means):
    name = "rt3-own-proba"

    def predict_proba(self, Z):  # overrides the checked one
        P = super().predict_proba(Z)
        return np.full_like(P, np.nan)


class NoDescription(Means):
    name = "rt3-no-description"
    description = ""


class UnseenLabels(Means):
    name = "rt3-unseen"

    def predict(self, Z):
        return np.full(len(Z), 999)


class Exits(Means):
    name = "rt3-exit"

    def _learn_one(self, z, yi):
        sys.exit(0)


class Unsaveable(Means):
    name = "rt3-unsaveable"

    def _state(self):
        return {**super()._state(), "scorer": lambda z: z}
'''


def flip(data: bytes, pos: int, bit: int = 0) -> bytes:
    b = bytearray(data)
    b[pos] ^= 1 << bit
    return bytes(b)


def member_span(data: bytes, name_suffix: str) -> tuple[int, int]:
    """(start, end) of the stored bytes of the first zip member whose name ends so."""
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        info = next(i for i in z.infolist() if i.filename.endswith(name_suffix))
    header = info.header_offset
    n, m = int.from_bytes(data[header + 26:header + 28], "little"), int.from_bytes(
        data[header + 28:header + 30], "little")
    start = header + 30 + n + m
    return start, start + info.compress_size


LEARNER = '''
from ciosl.learners.ncm import NCM


class L(NCM):
    name = "{name}"
{body}
'''


def own_learner(tmp: Path, monkeypatch, body: str = "") -> tuple[Path, str]:
    """A module defining a learner ``L`` (an NCM) under a fresh method name; its file and the
    ``--method`` spec."""
    module = f"rt3_{uuid.uuid4().hex[:8]}"
    path = tmp / f"{module}.py"
    path.write_text(LEARNER.format(name=module, body=body))
    monkeypatch.syspath_prepend(str(tmp))
    return path, f"{module}:L"


def one_line(err: BaseException) -> str:
    text = str(err)
    assert "\n" not in text and len(text) < 400, text
    return text


# ---- the baselines' tests (tests/learners/)
def class_blobs(n_per_class, n_classes=4, dim=8, sep=3.0, seed=0, shuffle=True):
    """(n_per_class * n_classes, dim) float32 Gaussian blobs around fixed centres and their
    labels, shuffled unless ``shuffle=False``."""
    rng = np.random.default_rng(seed)
    centers = np.random.default_rng(100).normal(size=(n_classes, dim)) * sep
    y = np.repeat(np.arange(n_classes), n_per_class)
    if shuffle:
        y = rng.permutation(y)
    return (centers[y] + rng.normal(size=(len(y), dim))).astype(np.float32), y


def mixture(n: int, d: int, seed: int, k: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """(n, d) float32 Gaussian mixture features and (n,) int labels in [0, k)."""
    rng = np.random.default_rng(seed)
    centers = np.random.default_rng(7).normal(0.0, 3.0, (k, d))
    y = rng.integers(k, size=n)
    return (centers[y] + rng.normal(0.0, 1.0, (n, d))).astype(np.float32), y


def class_by_class(classes, n_per_class, seed):
    """Blobs that arrive one class after another (a class-incremental stream)."""
    parts = [conformance.blobs([c], n_per_class, seed + c) for c in classes]
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def hidden(tensors):
    """The hidden layers' part of a per-tensor list (those never grow), flattened."""
    return torch.cat([t.reshape(-1) for t in tensors[:-2]])
