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
import contextlib
import ctypes
import hmac
import json
import threading
import time
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
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ciosl.serve.inputs import (  # noqa: F401 (Limits, Refused: this module's names too)
    ACCEPTED,
    JSON_TYPES,
    NPY,
    RAW,
    Limits,
    Refused,
    binary,
    header_text,
    labels,
    matrix,
    parse_json,
    rid,
)
from ciosl.serve.service import Service


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


class Api:
    """The endpoints, bound to one ``Service``, token, limits and (optionally) an image
    extractor."""

    def __init__(self, service: Service, token: str, limits: Limits, embedder=None):
        self.service, self.token, self.limits, self.embedder = service, token, limits, embedder
        self.metrics = Metrics(service)
        self.inflight = 0  # bytes of request bodies held now (the event loop's thread only)
        self._big_json = threading.Lock()
        service.on_commit = self.metrics.on_commit

    # ------------------------------------------------------------------ plumbing
    def _authorised(self, request: Request) -> bool:
        given = request.headers.get("authorization", "")
        scheme, _, value = given.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(
            value.strip().encode(), self.token.encode())

    async def _body(self, request: Request, hold: list[int]) -> bytes:
        """The body, within ``max_body`` bytes (``max_json_body`` for JSON), ``body_seconds``
        and the bytes all requests may hold at once (``hold[0]``: what this one holds, given
        back by ``_handle``)."""
        lim = self.limits
        json_body = _ctype(request) in JSON_TYPES
        cap, what = (lim.max_json_body, "a JSON body") if json_body else (lim.max_body, "body")
        length = request.headers.get("content-length")
        if length is not None and (not (length.isascii() and length.isdigit())
                                   or int(length) > cap):
            raise Refused(413, f"{what}: {length[:40]} bytes, at most {cap}" + (
                " (send features as application/x-npy)" if json_body else ""), close=True)

        def reserve(n: int) -> None:
            if self.inflight + n > lim.max_inflight:
                raise Refused(503, f"server busy: {self.inflight} bytes of request bodies "
                              f"held, at most {lim.max_inflight}; retry", close=True)
            self.inflight += n
            hold[0] += n

        if length is not None:
            reserve(int(length))

        async def read() -> bytes:
            chunks, total = [], 0
            async for chunk in request.stream():
                total += len(chunk)
                if total > cap:
                    raise Refused(413, f"{what}: more than {cap} bytes", close=True)
                if length is None:
                    reserve(len(chunk))
                chunks.append(chunk)
            return b"".join(chunks)

        try:
            return await asyncio.wait_for(read(), lim.body_seconds)
        except TimeoutError:
            raise Refused(408, f"body: not complete within {lim.body_seconds:g} s (--body-"
                          f"timeout); Content-Length {length}", close=True) from None

    def _parse(self, body: bytes, ctype: str, headers, *, learn: bool) -> tuple:
        """(x, y, id) of a request body; ``Refused`` naming the field."""
        ctype = ctype.split(";")[0].strip().lower()
        allowed = {"x", "images"} | ({"y", "id"} if learn else set())
        if ctype in JSON_TYPES:
            big = len(body) > 1 << 20
            with self._big_json if big else contextlib.nullcontext():
                try:  # one large JSON body parsed at a time, its memory given back after
                    doc = parse_json(body, allowed)
                    del body
                    if "images" in doc:
                        x = self._images(doc["images"])
                    else:
                        x = matrix(doc["x"], "x", self.limits)
                    y = labels(doc.get("y"), len(x), self.limits) if learn else None
                    return x, y, rid(doc.get("id"), self.limits) if learn else None
                finally:
                    doc = None
                    if big:
                        _trim()
        if ctype in (NPY, RAW):
            x = binary(body, ctype, headers, self.limits)
            if not learn:
                return x, None, None
            raw = header_text(headers, "x-ciosl-labels", "X-Ciosl-Labels")
            if raw is None:
                raise Refused(400, "X-Ciosl-Labels: a binary learn needs its labels as a JSON "
                              "array in this header")
            try:
                y = json.loads(raw)
            except ValueError:
                raise Refused(400, "X-Ciosl-Labels: not a JSON array") from None
            return x, labels(y, len(x), self.limits, "X-Ciosl-Labels"), rid(
                header_text(headers, "x-ciosl-id", "X-Ciosl-Id"), self.limits, "X-Ciosl-Id")
        raise Refused(415, f"content type {ctype[:60]!r} is not accepted; accepted: {ACCEPTED}")

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
            return self.embedder(blobs, max_pixels=self.limits.max_pixels)
        except ValueError as e:
            raise Refused(413 if "pixels" in str(e) else 400, str(e)) from None

    async def _handle(self, name: str, request: Request, work, *, auth: bool = True):
        t0 = time.perf_counter()
        hold = [0]
        close = False
        try:
            if auth and not self._authorised(request):
                status, body = 401, {"error": "missing or wrong token: send "
                                     "'Authorization: Bearer TOKEN'"}
            else:
                status, body = await work(request, hold)
        except Refused as e:
            status, body, close = e.status, {"error": str(e)}, e.close
        except ClientDisconnect:  # the client left mid-body: nobody to answer, nothing to say
            self.metrics.requests.labels(name, "disconnected").inc()
            return Response(status_code=400)
        finally:
            self.inflight -= hold[0]
        self.metrics.requests.labels(name, str(status)).inc()
        self.metrics.latency.labels(name).observe(time.perf_counter() - t0)
        if isinstance(body, Response):
            return body
        headers = {"WWW-Authenticate": "Bearer"} if status == 401 else {}
        if close:  # a body left unread cannot be followed by another request
            headers["Connection"] = "close"
        return JSONResponse(body, status_code=status, headers=headers)

    # ------------------------------------------------------------------ endpoints
    async def learn(self, request: Request):
        async def work(request, hold):
            body = await self._body(request, hold)
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
        async def work(request, hold):
            body = await self._body(request, hold)
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
        async def work(request, hold):
            return 200, {"classes": (await run_in_threadpool(self.service.state_classes))}
        return await self._handle("classes", request, work)

    async def state(self, request: Request):
        async def work(request, hold):
            return 200, await run_in_threadpool(self.service.state)
        return await self._handle("state", request, work)

    async def snapshot(self, request: Request):
        async def work(request, hold):
            answer = await asyncio.wrap_future(self.service.submit_snapshot())
            return answer.status, answer.body
        return await self._handle("snapshot", request, work)

    async def health(self, request: Request):
        async def work(request, hold):
            dead = self.service.dead()
            if dead is not None:  # learning stopped: not healthy, whatever else answers
                return 503, {"status": "broken", "error": dead, **self.service.status()}
            return 200, {"status": "ok", **self.service.status()}
        return await self._handle("health", request, work, auth=False)

    async def metrics_endpoint(self, request: Request):
        async def work(request, hold):
            return 200, Response(generate_latest(self.metrics.registry),
                                 media_type=CONTENT_TYPE_LATEST)
        return await self._handle("metrics", request, work)


def _ctype(request: Request) -> str:
    return request.headers.get("content-type", "").split(";")[0].strip().lower()


def _trim() -> None:
    """Give freed memory back to the system (glibc keeps what a large parse freed)."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


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
    paths = ", ".join(f"{'/'.join(sorted(r.methods - {'HEAD'}))} {r.path}" for r in routes)

    async def no_route(request: Request, exc: HTTPException):
        # one JSON line, and never a redirect: a slash added would send the client to the
        # Host header it gave (reflected), so a path is either served or refused
        what = "no endpoint" if exc.status_code == 404 else "method not allowed:"
        return JSONResponse({"error": f"{what} {request.method} {request.url.path[:80]}; "
                             f"endpoints: {paths}"}, status_code=exc.status_code)

    app = Starlette(routes=routes, exception_handlers={404: no_route, 405: no_route})
    app.router.redirect_slashes = False
    app.state.api = api
    return app
