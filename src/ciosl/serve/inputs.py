"""What a request may hold, and its parsing: a body (JSON, ``.npy`` or raw float32) into
``(x, y, id)``, or ``Refused`` naming the field, the header or the value in one line.

Limits (``Limits``): bytes of a body (a JSON body has its own, lower bound: a JSON number
costs about 30 times its text in memory while it is parsed), rows and width of x, decoded
pixels of a request's images, the characters of a label and an id, and the time a body may take
to arrive."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from ciosl.checks import bad_feature
from ciosl.serve.service import bad_text

JSON_TYPES = ("application/json", "")
NPY = "application/x-npy"
RAW = "application/octet-stream"
ACCEPTED = "application/json, application/x-npy, application/octet-stream"
SHAPE = re.compile(r"\s*(\d{1,12})\s*,\s*(\d{1,12})\s*", re.ASCII)
FRAME_SHAPE = re.compile(r"\s*(\d{1,12})\s*,\s*(\d{1,12})\s*,\s*(\d{1,12})\s*,"
                         r"\s*(\d{1,12})\s*", re.ASCII)
MAX_FRAME_PIXELS = 4096 * 4096  # one frame, as one image (images.MAX_PIXELS)


class Frames:
    """Raw uint8 frames (n, h, w, 3) of a binary body, for the server's extractor."""

    def __init__(self, array: np.ndarray):
        self.array = array

    def __len__(self) -> int:
        return len(self.array)


def frames(arr: np.ndarray, limits: Limits, field: str = "frames") -> Frames:
    """``arr`` as frames, or ``Refused`` naming what is wrong: uint8 of shape (n, h, w, 3),
    n within ``max_rows``, each frame and all of them within the pixel bounds."""
    if arr.dtype != np.uint8:
        raise Refused(400, f"{field}: dtype {arr.dtype}, frames are uint8 (n, h, w, 3)")
    if arr.ndim != 4 or arr.shape[3] != 3 or 0 in arr.shape:
        raise Refused(400, f"{field}: shape {arr.shape}, frames are (n, h, w, 3) with n, h, "
                      "w >= 1")
    n, h, w, _ = arr.shape
    if n > limits.max_rows:
        raise Refused(413, f"{field}: {n} frames, at most {limits.max_rows} per request")
    if h * w > MAX_FRAME_PIXELS:
        raise Refused(413, f"{field}: {w}x{h} pixels, at most {MAX_FRAME_PIXELS} per frame")
    if n * h * w > limits.max_pixels:
        raise Refused(413, f"{field}: {n * h * w} pixels, at most {limits.max_pixels} per "
                      "request")
    return Frames(np.ascontiguousarray(arr))


@dataclass(frozen=True)
class Limits:
    max_body: int = 64 << 20  # bytes of one request body
    max_json_body: int = 16 << 20  # bytes of one JSON body (parsed into Python objects)
    max_rows: int = 4096  # samples in one request
    max_width: int = 1 << 16  # features per sample
    max_label_chars: int = 256
    max_id_chars: int = 200
    max_pixels: int = 64 << 20  # decoded pixels of all the images of one request
    body_seconds: float = 30.0  # a body must arrive within this many seconds
    max_inflight: int = 256 << 20  # bytes of request bodies held at once, all requests


class Refused(Exception):
    def __init__(self, status: int, message: str, *, close: bool = False):
        super().__init__(message)
        self.status = status
        self.close = close  # the connection cannot be reused (a body left unread)


def _reject_constant(name: str):
    raise ValueError(f"{name} is not a finite number")


def matrix(value: Any, field: str, limits: Limits) -> np.ndarray:
    """A JSON list of rows as a finite (n, d) float32 array, or ``Refused`` naming ``field``."""
    if not isinstance(value, list) or not value:
        raise Refused(400, f"{field}: expected a non-empty list of rows of numbers")
    if len(value) > limits.max_rows:
        raise Refused(413, f"{field}: {len(value)} rows, at most {limits.max_rows} per request")
    for i, row in enumerate(value):  # true is no number (numpy would take it as 1.0)
        if isinstance(row, list) and bool in set(map(type, row)):
            j = next(j for j, v in enumerate(row) if isinstance(v, bool))
            raise Refused(400, f"{field}[{i}][{j}]: expected a number, got a boolean")
    try:
        arr = np.asarray(value)
    except ValueError:
        arr = None
    if arr is None or arr.ndim != 2 or arr.dtype.kind not in "iuf":
        raise Refused(400, f"{field}: expected rows of equal length holding numbers only")
    return checked(arr, field, limits)


def checked(arr: np.ndarray, field: str, limits: Limits) -> np.ndarray:
    if arr.ndim != 2 or arr.shape[0] == 0 or arr.shape[1] == 0:
        raise Refused(400, f"{field}: expected a non-empty 2-d array, got shape {arr.shape}")
    if arr.shape[0] > limits.max_rows:
        raise Refused(413, f"{field}: {arr.shape[0]} rows, at most {limits.max_rows} per request")
    if arr.shape[1] > limits.max_width:
        raise Refused(413, f"{field}: width {arr.shape[1]}, at most {limits.max_width}")
    if arr.dtype.kind not in "iuf":
        raise Refused(400, f"{field}: expected real numbers, got dtype {arr.dtype}")
    found = bad_feature(arr)
    if found is not None:
        raise Refused(400, f"{field}: row {found[0]} {found[1]}")
    return np.require(arr, np.float32, ["C_CONTIGUOUS", "ALIGNED", "OWNDATA"])


def labels(value: Any, n: int, limits: Limits, field: str = "y") -> list:
    if not isinstance(value, list):
        raise Refused(400, f"{field}: expected a list of labels (integers or strings)")
    if len(value) != n:
        raise Refused(400, f"{field}: {len(value)} labels for {n} rows of x")
    for i, lab in enumerate(value):
        if isinstance(lab, bool) or not isinstance(lab, int | str):
            raise Refused(400, f"{field}[{i}]: labels are integers or strings, got "
                          f"{type(lab).__name__}")
        if isinstance(lab, str) and len(lab) > limits.max_label_chars:
            raise Refused(400, f"{field}[{i}]: a label of {len(lab)} characters, at most "
                          f"{limits.max_label_chars}")
        if isinstance(lab, int) and not -(2**63) <= lab < 2**63:
            raise Refused(400, f"{field}[{i}]: integer labels must fit 64 bits")
    bad = bad_text(value, None)
    if bad is not None:
        raise Refused(400, bad.replace("y[", f"{field}[", 1))
    return value


def rid(value: Any, limits: Limits, field: str = "id") -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > limits.max_id_chars:
        raise Refused(400, f"{field}: expected a string of 1 to {limits.max_id_chars} "
                      "characters")
    bad = bad_text([], value)
    if bad is not None:
        raise Refused(400, bad.replace("id", field, 1))
    return value


def header_text(headers, name: str, shown: str) -> str | None:
    """A header's value as UTF-8 text (HTTP hands it over as Latin-1: ``café`` sent as raw
    UTF-8, as curl does, would read ``cafÃ©``)."""
    raw = headers.get(name)
    if raw is None:
        return None
    try:
        return raw.encode("latin-1").decode("utf-8")
    except UnicodeError:
        raise Refused(400, f"{shown}: not UTF-8 text") from None


def parse_json(body: bytes, allowed: set[str]) -> dict:
    try:
        doc = json.loads(body, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as e:
        raise Refused(400, f"body: not valid JSON ({str(e).splitlines()[0]})") from None
    if not isinstance(doc, dict):
        raise Refused(400, "body: expected a JSON object")
    unknown = sorted(set(doc) - allowed)
    if unknown:
        raise Refused(400, f"unknown field(s) {', '.join(map(repr, unknown))}; "
                      f"allowed: {', '.join(sorted(allowed))}")
    if ("x" in doc) == ("images" in doc):
        raise Refused(400, "give exactly one of x and images")
    return doc


def binary(body: bytes, ctype: str, headers, limits: Limits) -> np.ndarray | Frames:
    if ctype == NPY:
        import io

        try:
            arr = np.load(io.BytesIO(body), allow_pickle=False)
        except Exception as e:
            raise Refused(400, f"body: not a .npy array ({type(e).__name__})") from None
        if not isinstance(arr, np.ndarray):
            raise Refused(400, "body: not a .npy array")
        if arr.ndim == 4:  # raw frames (n, h, w, 3)
            return frames(arr, limits)
        return checked(arr, "x", limits)
    shape = header_text(headers, "x-ciosl-shape", "X-Ciosl-Shape") or ""
    found = SHAPE.fullmatch(shape)
    if found is None:
        found = FRAME_SHAPE.fullmatch(shape)
        if found is None:
            raise Refused(400, "X-Ciosl-Shape: expected 'n,d' (float32 features) or 'n,h,w,3' "
                          f"(uint8 frames), ASCII digits; got {shape[:40]!r}")
        n, h, w, c = (int(g) for g in found.groups())
        if c != 3 or min(n, h, w) < 1:
            raise Refused(400, f"X-Ciosl-Shape: {n},{h},{w},{c}: frames are n,h,w,3 with n, h, "
                          "w >= 1")
        if n * h * w * c != len(body):
            raise Refused(400, f"body: {len(body)} bytes, X-Ciosl-Shape {n},{h},{w},{c} needs "
                          f"{n * h * w * c} (uint8 frames)")
        return frames(np.frombuffer(body, dtype=np.uint8).reshape(n, h, w, c), limits)
    n, d = int(found.group(1)), int(found.group(2))
    if n * d * 4 != len(body):
        raise Refused(400, f"body: {len(body)} bytes, X-Ciosl-Shape {n},{d} needs "
                      f"{n * d * 4} (float32)")
    return checked(np.frombuffer(body, dtype="<f4").reshape(n, d), "x", limits)


def feedback_body(body: bytes, limits: Limits) -> tuple[list[str], list, bool]:
    """(prediction ids, labels, whether one was given alone) of a feedback body
    ``{"prediction_id": ID, "y": LABEL}`` or ``{"prediction_id": [...], "y": [...]}``."""
    try:
        doc = json.loads(body, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as e:
        raise Refused(400, f"body: not valid JSON ({str(e).splitlines()[0]})") from None
    if not isinstance(doc, dict):
        raise Refused(400, "body: expected a JSON object")
    unknown = sorted(set(doc) - {"prediction_id", "y"})
    if unknown:
        raise Refused(400, f"unknown field(s) {', '.join(map(repr, unknown))[:200]}; allowed: "
                      "prediction_id, y")
    for key in ("prediction_id", "y"):
        if key not in doc:
            raise Refused(400, f"{key}: missing (feedback is {{\"prediction_id\": ID, \"y\": "
                          "LABEL}, or lists of both)")
    pids, y = doc["prediction_id"], doc["y"]
    single = not isinstance(pids, list)
    if single:
        if isinstance(y, list):
            raise Refused(400, "y: one label for one prediction_id (or lists of both)")
        pids, y = [pids], [y]
    if not pids:
        raise Refused(400, "prediction_id: an empty list")
    if len(pids) > limits.max_rows:
        raise Refused(413, f"prediction_id: {len(pids)}, at most {limits.max_rows} per request")
    for i, pid in enumerate(pids):
        if not isinstance(pid, str):
            where = "prediction_id" if single else f"prediction_id[{i}]"
            raise Refused(400, f"{where}: expected a prediction id such as 'p-12'")
    try:
        y = labels(y, len(pids), limits)
    except Refused as e:
        raise Refused(e.status, str(e).replace("y[0]", "y", 1) if single else str(e)) from None
    return pids, y, single
