"""The HTTP API of a served learner (Starlette): ``/v1/learn``, ``/v1/predict``,
``/v1/classes``, ``/v1/state``, ``/v1/snapshot``, ``/v1/health`` and ``/metrics``.

Request bodies: ``application/json`` (the default), ``application/x-npy`` (a 2-d float array in
NumPy's format; labels and id of a learn in the ``X-Ciosl-Labels`` (a JSON array) and
``X-Ciosl-Id`` headers) or ``application/octet-stream`` (raw little-endian float32, its shape in
``X-Ciosl-Shape: n,d``, labels and id as for npy). Every endpoint but health needs
``Authorization: Bearer TOKEN``. A refused request changes nothing and is answered
``{"error": "<one line naming the field>"}``.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import io
import json
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ciosl.checks import bad_feature
from ciosl.serve.service import Service

JSON_TYPES = ("application/json", "")
NPY = "application/x-npy"
RAW = "application/octet-stream"
ACCEPTED = "application/json, application/x-npy, application/octet-stream"


@dataclass(frozen=True)
class Limits:
    max_body: int = 64 << 20  # bytes of one request body
    max_rows: int = 4096  # samples in one request
    max_width: int = 1 << 16  # features per sample
    max_label_chars: int = 256
    max_id_chars: int = 200


class Refused(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class Metrics:
    """Prometheus metrics of one server (its own registry)."""

    def __init__(self, service: Service):
        r = self.registry = CollectorRegistry()
        self.requests = Counter("ciosl_requests", "HTTP requests by endpoint and status",
                                ["endpoint", "status"], registry=r)
        self.latency = Histogram("ciosl_request_seconds", "request latency by endpoint",
                                 ["endpoint"], registry=r,
                                 buckets=(.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5,
                                          1, 2.5, 5, 10))
        self.learned = Counter("ciosl_samples_learned", "samples learned and acknowledged",
                               registry=r)
        self.fsync = Histogram("ciosl_log_fsync_seconds", "write + fsync of one group commit",
                               registry=r, buckets=(.0001, .0005, .001, .0025, .005, .01, .025,
                                                    .05, .1, .25, 1))
        self.group = Histogram("ciosl_group_requests", "learn requests per group commit",
                               registry=r, buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512))
        Gauge("ciosl_snapshot_age_seconds", "seconds since the last snapshot",
              registry=r).set_function(lambda: time.time() - service.snap_time)
        Gauge("ciosl_classes", "classes learned", registry=r).set_function(
            lambda: len(service.learner.classes_))
        Gauge("ciosl_samples_seen", "samples the learner has seen", registry=r).set_function(
            lambda: service.learner.n_seen_)
        Gauge("ciosl_log_seq", "last acknowledged log record", registry=r).set_function(
            lambda: service.seq)

    def on_commit(self, seconds: float, requests: int, samples: int) -> None:
        self.fsync.observe(seconds)
        self.group.observe(requests)
        self.learned.inc(samples)


def _reject_constant(name: str):
    raise ValueError(f"{name} is not a finite number")


def _matrix(value: Any, field: str, limits: Limits) -> np.ndarray:
    """A JSON list of rows as a finite (n, d) float32 array, or ``Refused`` naming ``field``."""
    if not isinstance(value, list) or not value:
        raise Refused(400, f"{field}: expected a non-empty list of rows of numbers")
    if len(value) > limits.max_rows:
        raise Refused(413, f"{field}: {len(value)} rows, at most {limits.max_rows} per request")
    try:
        arr = np.asarray(value)
    except ValueError:
        arr = None
    if arr is None or arr.ndim != 2 or arr.dtype.kind not in "iuf":
        raise Refused(400, f"{field}: expected rows of equal length holding numbers only")
    return _checked(arr, field, limits)


def _checked(arr: np.ndarray, field: str, limits: Limits) -> np.ndarray:
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
    return np.ascontiguousarray(arr, dtype=np.float32)


def _labels(value: Any, n: int, limits: Limits, field: str = "y") -> list:
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
    return value


def _rid(value: Any, limits: Limits) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > limits.max_id_chars:
        raise Refused(400, f"id: expected a string of 1 to {limits.max_id_chars} characters")
    return value


class Api:
    """The endpoints, bound to one ``Service``, token, limits and (optionally) an image
    extractor."""

    def __init__(self, service: Service, token: str, limits: Limits, embedder=None):
        self.service, self.token, self.limits, self.embedder = service, token, limits, embedder
        self.metrics = Metrics(service)
        service.on_commit = self.metrics.on_commit

    # ------------------------------------------------------------------ plumbing
    def _authorised(self, request: Request) -> bool:
        given = request.headers.get("authorization", "")
        scheme, _, value = given.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(
            value.strip().encode(), self.token.encode())

    async def _body(self, request: Request) -> bytes:
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limits.max_body):
            raise Refused(413, f"body: {length} bytes, at most {self.limits.max_body}")
        chunks, total = [], 0
        async for chunk in request.stream():
            total += len(chunk)
            if total > self.limits.max_body:
                raise Refused(413, f"body: more than {self.limits.max_body} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    def _parse(self, body: bytes, ctype: str, headers, *, learn: bool) -> tuple:
        """(x, y, id) of a request body; ``Refused`` naming the field."""
        ctype = ctype.split(";")[0].strip().lower()
        allowed = {"x", "images"} | ({"y", "id"} if learn else set())
        if ctype in JSON_TYPES:
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
            if "images" in doc:
                x = self._images(doc["images"])
            else:
                x = _matrix(doc["x"], "x", self.limits)
            y = _labels(doc.get("y"), len(x), self.limits) if learn else None
            return x, y, _rid(doc.get("id"), self.limits) if learn else None
        if ctype in (NPY, RAW):
            x = self._binary(body, ctype, headers)
            if not learn:
                return x, None, None
            raw = headers.get("x-ciosl-labels")
            if raw is None:
                raise Refused(400, "X-Ciosl-Labels: a binary learn needs its labels as a JSON "
                              "array in this header")
            try:
                y = json.loads(raw)
            except ValueError:
                raise Refused(400, "X-Ciosl-Labels: not a JSON array") from None
            return x, _labels(y, len(x), self.limits, "X-Ciosl-Labels"), _rid(
                headers.get("x-ciosl-id"), self.limits)
        raise Refused(415, f"content type {ctype!r} is not accepted; accepted: {ACCEPTED}")

    def _binary(self, body: bytes, ctype: str, headers) -> np.ndarray:
        if ctype == NPY:
            try:
                arr = np.load(io.BytesIO(body), allow_pickle=False)
            except Exception as e:
                raise Refused(400, f"body: not a .npy array ({type(e).__name__})") from None
            if not isinstance(arr, np.ndarray):
                raise Refused(400, "body: not a .npy array")
            return _checked(arr, "x", self.limits)
        shape = headers.get("x-ciosl-shape", "")
        parts = shape.split(",")
        if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
            raise Refused(400, f"X-Ciosl-Shape: expected 'n,d', got {shape[:40]!r}")
        n, d = (int(p) for p in parts)
        if n * d * 4 != len(body):
            raise Refused(400, f"body: {len(body)} bytes, X-Ciosl-Shape {n},{d} needs "
                          f"{n * d * 4} (float32)")
        return _checked(np.frombuffer(body, dtype="<f4").reshape(n, d), "x", self.limits)

    def _images(self, value: Any) -> np.ndarray:
        if self.embedder is None:
            raise Refused(400, "images: this server has no extractor (start it with "
                          "--extractor)")
        if not isinstance(value, list) or not value:
            raise Refused(400, "images: expected a non-empty list of base64 images")
        if len(value) > self.limits.max_rows:
            raise Refused(413, f"images: {len(value)}, at most {self.limits.max_rows}")
        blobs = []
        for i, item in enumerate(value):
            if not isinstance(item, str):
                raise Refused(400, f"images[{i}]: expected a base64 string")
            try:
                blobs.append(base64.b64decode(item, validate=True))
            except ValueError:
                raise Refused(400, f"images[{i}]: not valid base64") from None
        try:
            return self.embedder(blobs)
        except ValueError as e:
            raise Refused(400, str(e)) from None

    async def _handle(self, name: str, request: Request, work, *, auth: bool = True):
        t0 = time.perf_counter()
        try:
            if auth and not self._authorised(request):
                status, body = 401, {"error": "missing or wrong token: send "
                                     "'Authorization: Bearer TOKEN'"}
            else:
                status, body = await work(request)
        except Refused as e:
            status, body = e.status, {"error": str(e)}
        self.metrics.requests.labels(name, str(status)).inc()
        self.metrics.latency.labels(name).observe(time.perf_counter() - t0)
        if isinstance(body, Response):
            return body
        headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
        return JSONResponse(body, status_code=status, headers=headers)

    # ------------------------------------------------------------------ endpoints
    async def learn(self, request: Request):
        async def work(request):
            body = await self._body(request)
            x, y, rid = await run_in_threadpool(self._parse, body,
                                                request.headers.get("content-type", ""),
                                                request.headers, learn=True)
            dim = self.service.learner.dim_
            if dim is not None and x.shape[1] != dim:
                raise Refused(422, f"x: width {x.shape[1]}, this learner's is {dim}")
            answer = await asyncio.wrap_future(self.service.submit_learn(x, y, rid))
            return answer.status, answer.body
        return await self._handle("learn", request, work)

    async def predict(self, request: Request):
        async def work(request):
            body = await self._body(request)
            x, _, _ = await run_in_threadpool(self._parse, body,
                                              request.headers.get("content-type", ""),
                                              request.headers, learn=False)
            try:
                classes, P = await run_in_threadpool(self.service.predict_proba, x)
            except LookupError as e:
                raise Refused(409, str(e)) from None
            except (ValueError, TypeError) as e:
                raise Refused(422, str(e).splitlines()[0]) from None
            labels = [classes[i] for i in P.argmax(axis=1)]
            return 200, {"classes": classes, "proba": P.tolist(), "label": labels}
        return await self._handle("predict", request, work)

    async def classes(self, request: Request):
        async def work(request):
            return 200, {"classes": (await run_in_threadpool(self.service.state_classes))}
        return await self._handle("classes", request, work)

    async def state(self, request: Request):
        async def work(request):
            return 200, await run_in_threadpool(self.service.state)
        return await self._handle("state", request, work)

    async def snapshot(self, request: Request):
        async def work(request):
            answer = await asyncio.wrap_future(self.service.submit_snapshot())
            return answer.status, answer.body
        return await self._handle("snapshot", request, work)

    async def health(self, request: Request):
        async def work(request):
            return 200, {"status": "ok", **self.service.status()}
        return await self._handle("health", request, work, auth=False)

    async def metrics_endpoint(self, request: Request):
        async def work(request):
            return 200, Response(generate_latest(self.metrics.registry),
                                 media_type=CONTENT_TYPE_LATEST)
        return await self._handle("metrics", request, work)


def build_app(service: Service, token: str, limits: Limits | None = None,
              embedder=None) -> Starlette:
    api = Api(service, token, limits or Limits(), embedder)
    routes = [
        Route("/v1/learn", api.learn, methods=["POST"]),
        Route("/v1/predict", api.predict, methods=["POST"]),
        Route("/v1/classes", api.classes, methods=["GET"]),
        Route("/v1/state", api.state, methods=["GET"]),
        Route("/v1/snapshot", api.snapshot, methods=["POST"]),
        Route("/v1/health", api.health, methods=["GET"]),
        Route("/metrics", api.metrics_endpoint, methods=["GET"]),
    ]
    app = Starlette(routes=routes)
    app.state.api = api
    return app
