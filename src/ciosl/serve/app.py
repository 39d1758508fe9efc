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
import weakref
from typing import Any

import numpy as np
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ciosl.serve.batching import Turnstile
from ciosl.serve.coalesce import Coalescer
from ciosl.serve.events import frame, last_event_id
from ciosl.serve.feedback import Gone
from ciosl.serve.hub import DEFAULT, Hub, Unavailable
from ciosl.serve.inputs import (  # noqa: F401 (Limits, Refused: this module's names too)
    ACCEPTED,
    JSON_TYPES,
    NPY,
    RAW,
    Frames,
    Limits,
    Refused,
    binary,
    feedback_body,
    header_text,
    labels,
    matrix,
    parse_json,
    rid,
)
from ciosl.serve.metrics import Metrics


class Api:
    """The endpoints, bound to a ``Hub`` of learners, a token, limits and (optionally) an
    image extractor (``extractor``: its name, for health)."""

    def __init__(self, hub: Hub, token: str, limits: Limits, embedder=None,
                 extractor: str | None = None):
        self.hub, self.token, self.limits, self.embedder = hub, token, limits, embedder
        self.extractor = extractor
        self.stopping = lambda: False  # the server is stopping: event streams end
        self.metrics = Metrics(hub)
        self.inflight = 0  # bytes of request bodies held now (the event loop's thread only)
        self._big_json = threading.Lock()
        self._order: dict[str, Turnstile] = {}  # learns reach each writer in arrival order
        # predictions asked together answered in one call (coalesce.py), per loaded learner
        self._together: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        hub.on_commit = self.metrics.on_commit

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
            if isinstance(x, Frames):  # uint8 (n, h, w, 3): through the extractor
                x = self._frames(x.array)
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

    def _frames(self, arr: np.ndarray) -> np.ndarray:
        if self.embedder is None:
            raise Refused(400, "frames: this server has no extractor (start it with "
                          "--extractor); send features as 2-d float32")
        return self.embedder.frames(arr)

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
        except Unavailable as e:  # no such learner, a bad name, one that cannot be loaded
            status, body = e.status, {"error": str(e)}
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
        if status == 201:
            headers["Location"] = f"/v1/learners/{body.get('name')}"
        if close:  # a body left unread cannot be followed by another request
            headers["Connection"] = "close"
        return JSONResponse(body, status_code=status, headers=headers)

    # ------------------------------------------------------------------ one learner's endpoints
    async def _learner(self, request: Request, kind: str, fn):
        """``fn(service, request, hold)`` on the learner named by the path (``default`` at the
        old URLs), loaded and held for the call."""
        name = request.path_params.get("name", DEFAULT)

        async def work(request, hold):
            service = await run_in_threadpool(self.hub.acquire, name)
            try:
                return await fn(service, request, hold)
            finally:
                self.hub.release(name)
        return await self._handle(kind, request, work)

    async def _features(self, request: Request, hold: list[int], *, learn: bool) -> tuple:
        body = await self._body(request, hold)
        return await run_in_threadpool(self._parse, body, request.headers.get("content-type", ""),
                                       request.headers, learn=learn)

    async def learn(self, request: Request):
        async def fn(service, request, hold):
            t0 = time.perf_counter()
            order = self._order.setdefault(request.path_params.get("name", DEFAULT),
                                           Turnstile())
            ticket = None
            try:
                body = await self._body(request, hold)
                ticket = order.take()  # arrival: the body is here
                x, y, rid = await run_in_threadpool(
                    self._parse, body, request.headers.get("content-type", ""),
                    request.headers, learn=True)
                del body
                dim = service.learner.dim_
                if dim is not None and x.shape[1] != dim:
                    raise Refused(422, f"x: width {x.shape[1]}, this learner's is {dim}")
                if request.query_params.get("check") == "1":  # parsed and checked, no more
                    return 200, {"checked": len(y), "learned": 0}
                await order.turn(ticket)
                future = service.submit_learn(x, y, rid)
            finally:
                if ticket is not None:
                    order.done(ticket)
            answer = await asyncio.wrap_future(future)
            if answer.status == 200:
                service.rates.record("learn", time.perf_counter() - t0, answer.body["learned"])
            return answer.status, answer.body
        return await self._learner(request, "learn", fn)

    async def predict(self, request: Request):
        async def fn(service, request, hold):
            t0 = time.perf_counter()
            min_seq = _min_seq(request.query_params.get("min_seq"))
            x, _, _ = await self._features(request, hold, learn=False)
            if min_seq is not None and not await run_in_threadpool(
                    _applied, service, min_seq, self.hub.options.min_seq_wait):
                raise Refused(503, f"this replica has applied up to seq {service.seq}, "
                              f"{min_seq} asked; retry or ask another replica")
            try:
                together = self._together.get(service)
                if together is None:  # the event loop's thread only: no lock needed
                    together = self._together[service] = Coalescer(service.predict)
                answer = await run_in_threadpool(together, x)
            except LookupError as e:
                raise Refused(409, str(e)) from None
            except (ValueError, TypeError) as e:
                raise Refused(422, str(e).splitlines()[0]) from None
            service.rates.record("predict", time.perf_counter() - t0, len(x))
            return 200, answer
        return await self._learner(request, "predict", fn)

    async def feedback(self, request: Request):
        async def fn(service, request, hold):
            t0 = time.perf_counter()
            body = await self._body(request, hold)
            if _ctype(request) not in JSON_TYPES:
                raise Refused(415, "feedback: a JSON body {\"prediction_id\", \"y\"}")
            pids, y, single = feedback_body(body, self.limits)
            kept = []
            for i, pid in enumerate(pids):
                try:
                    kept.append(service.window.get(
                        pid, "prediction_id" if single else f"prediction_id[{i}]"))
                except ValueError as e:
                    raise Refused(400, str(e)) from None
                except Gone as e:
                    raise Refused(e.status, str(e)) from None
            dim = service.learner.dim_
            if dim is not None and len(kept[0].x) != dim:
                raise Refused(422, f"prediction_id: features of width {len(kept[0].x)}, this "
                              f"learner's is {dim}")
            answer = await asyncio.wrap_future(service.submit_feedback(pids, kept, y))
            if answer.status == 200:
                service.rates.record("learn", time.perf_counter() - t0, answer.body["learned"])
            return answer.status, answer.body
        return await self._learner(request, "feedback", fn)

    async def classes(self, request: Request):
        async def fn(service, request, hold):
            return 200, {"classes": (await run_in_threadpool(service.state_classes))}
        return await self._learner(request, "classes", fn)

    async def state(self, request: Request):
        async def fn(service, request, hold):
            state = await run_in_threadpool(service.state)
            return 200, {**state, "skipped": state.get("skipped", 0)}
        return await self._learner(request, "state", fn)

    async def snapshot(self, request: Request):
        async def fn(service, request, hold):
            answer = await asyncio.wrap_future(service.submit_snapshot())
            return answer.status, answer.body
        return await self._learner(request, "snapshot", fn)

    async def live(self, request: Request):
        async def fn(service, request, hold):
            return 200, await run_in_threadpool(service.live)
        return await self._learner(request, "learner_metrics", fn)

    async def events(self, request: Request):
        """Server-Sent Events; the learner stays loaded while someone listens."""
        name = request.path_params.get("name", DEFAULT)

        async def work(request, hold):
            service = await run_in_threadpool(self.hub.acquire, name)
            log = service.events
            after = last_event_id(request.headers.get("last-event-id"))

            async def stream():
                nonlocal after
                try:
                    yield b": ciosl events\n\n"
                    next_score = 0.0
                    while True:
                        now = time.monotonic()
                        if now >= next_score:
                            next_score = now + 1.0
                            with service.score_lock:
                                key = (service.seq, service.score.n)
                            if log.score_due(key):
                                log.add("score", await run_in_threadpool(service.live))
                        for event in log.after(after):
                            after = event[0]
                            yield frame(*event)
                        if self.stopping() or await request.is_disconnected():
                            return
                        await asyncio.sleep(0.2)
                finally:
                    self.hub.release(name)

            return 200, StreamingResponse(stream(), media_type="text/event-stream",
                                          headers={"Cache-Control": "no-store",
                                                   "X-Accel-Buffering": "no"})
        return await self._handle("events", request, work)


    # ------------------------------------------------------------------ the server's own
    async def health(self, request: Request):
        async def work(request, hold):
            names = await run_in_threadpool(self.hub.names)
            out = {"status": "ok", "learners": len(names), "loaded": self.hub.loaded(),
                   "extractor": self.extractor}
            if DEFAULT not in names:
                return 200, out
            service = await run_in_threadpool(self.hub.acquire, DEFAULT)
            try:
                dead = service.dead()
                if dead is not None:  # learning stopped: not healthy, whatever else answers
                    return 503, {**out, "status": "broken", "error": dead, **service.status()}
                return 200, {**out, **service.status()}
            finally:
                self.hub.release(DEFAULT)
        return await self._handle("health", request, work, auth=False)

    async def metrics_endpoint(self, request: Request):
        async def work(request, hold):
            text = await run_in_threadpool(generate_latest, self.metrics.registry)
            return 200, Response(text, media_type=CONTENT_TYPE_LATEST)
        return await self._handle("metrics", request, work)

    async def methods(self, request: Request):
        async def work(request, hold):
            return 200, {"methods": await run_in_threadpool(methods_catalogue)}
        return await self._handle("methods", request, work)

    async def list_learners(self, request: Request):
        def rows():
            out = []
            for name in self.hub.names():
                with contextlib.suppress(OSError, ValueError):  # deleted meanwhile
                    row = self.hub.row(name)
                    out.append({k: row[k] for k in ("name", "method", "seen", "classes", "seq",
                                                    "loaded", "accuracy")})
            return out

        async def work(request, hold):
            return 200, {"learners": await run_in_threadpool(rows)}
        return await self._handle("learners", request, work)

    async def create_learner(self, request: Request):
        async def work(request, hold):
            body = await self._body(request, hold)
            if _ctype(request) not in JSON_TYPES:
                raise Refused(415, "a new learner is a JSON body {\"name\", \"method\", "
                              "\"settings\"}")
            doc = learner_body(body)
            row = await run_in_threadpool(self.hub.create, doc.get("name"), doc.get("method"),
                                          doc.get("settings"))
            return 201, row
        return await self._handle("learners", request, work)

    async def one_learner(self, request: Request):
        name = request.path_params["name"]

        async def work(request, hold):
            service = await run_in_threadpool(self.hub.acquire, name)
            try:
                row = self.hub.row(name)
                return 200, {**row, "settings": service.settings,
                             "classes_list": await run_in_threadpool(service.state_classes)}
            finally:
                self.hub.release(name)
        return await self._handle("learner", request, work)

    async def delete_learner(self, request: Request):
        name = request.path_params["name"]

        async def work(request, hold):
            return 200, await run_in_threadpool(self.hub.delete, name,
                                                request.query_params.get("confirm"))
        return await self._handle("learner", request, work)


def _min_seq(value: str | None) -> int | None:
    """``?min_seq=N`` of a predict (read your own writes), or None."""
    if value is None:
        return None
    if not (value.isascii() and value.isdigit() and len(value) <= 18):
        raise Refused(400, f"min_seq: expected a whole number >= 0, got {value[:40]!r}")
    return int(value)


def _applied(service, seq: int, wait: float) -> bool:
    """Whether ``service`` has applied record ``seq``: a replica waits up to ``wait`` seconds
    for its stream; a folder's single writer has nothing more to wait for."""
    waiting = getattr(service, "wait_applied", None)
    return waiting(seq, wait) if waiting is not None else service.seq >= seq


def learner_body(body: bytes) -> dict:
    try:
        doc = json.loads(body or b"{}")
    except ValueError as e:
        raise Refused(400, f"body: not valid JSON ({str(e).splitlines()[0]})") from None
    if not isinstance(doc, dict):
        raise Refused(400, "body: expected a JSON object {\"name\", \"method\", \"settings\"}")
    unknown = sorted(set(doc) - {"name", "method", "settings"})
    if unknown:
        raise Refused(400, f"unknown field(s) {', '.join(map(repr, unknown))[:200]}; allowed: "
                      "method, name, settings")
    return doc


_TYPES = {int: "int", float: "float", bool: "bool", str: "str", tuple: "list"}


def methods_catalogue() -> list[dict]:
    """What ``ciosl methods`` and ``ciosl methods NAME`` print, as JSON."""
    from ciosl.learners import available_methods
    from ciosl.learners.settings import plain

    out = []
    for name, cls in available_methods().items():
        settings = [{"name": s.name, "default": _jsonable(plain(s.default)), "help": s.help,
                     "type": _TYPES.get(s.type, getattr(s.type, "__name__", str(s.type)))}
                    for s in cls.settings()]
        out.append({"name": name, "description": cls.description, "settings": settings})
    return out


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str | list):
        return value
    return str(value)


def _ctype(request: Request) -> str:
    return request.headers.get("content-type", "").split(";")[0].strip().lower()


def _trim() -> None:
    """Give freed memory back to the system (glibc keeps what a large parse freed)."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def build_app(hub: Hub, token: str, limits: Limits | None = None, embedder=None,
              extractor: str | None = None) -> Starlette:
    api = Api(hub, token, limits or Limits(), embedder, extractor)
    per_learner = [("learn", api.learn, "POST"), ("predict", api.predict, "POST"),
                   ("feedback", api.feedback, "POST"), ("classes", api.classes, "GET"),
                   ("state", api.state, "GET"), ("snapshot", api.snapshot, "POST"),
                   ("metrics", api.live, "GET"), ("events", api.events, "GET")]
    routes = [Route("/v1/health", api.health, methods=["GET"]),
              Route("/v1/methods", api.methods, methods=["GET"]),
              Route("/v1/learners", api.list_learners, methods=["GET"]),
              Route("/v1/learners", api.create_learner, methods=["POST"]),
              Route("/v1/learners/{name}", api.one_learner, methods=["GET"]),
              Route("/v1/learners/{name}", api.delete_learner, methods=["DELETE"])]
    for what, endpoint, method in per_learner:
        routes.append(Route(f"/v1/learners/{{name}}/{what}", endpoint, methods=[method]))
        routes.append(Route(f"/v1/{what}", endpoint, methods=[method]))  # the learner default
    routes.append(Route("/metrics", api.metrics_endpoint, methods=["GET"]))
    with contextlib.suppress(ImportError):  # the page (console/), when present
        from ciosl.serve.console import console_routes

        routes += console_routes()
    paths = ", ".join(sorted({f"{'/'.join(sorted(r.methods - {'HEAD'}))} {r.path}"
                              for r in routes if r.path.startswith("/v1/learn")})[:6])

    async def no_route(request: Request, exc: HTTPException):
        # one JSON line, and never a redirect: a slash added would send the client to the
        # Host header it gave (reflected), so a path is either served or refused
        what = "no endpoint" if exc.status_code == 404 else "method not allowed:"
        return JSONResponse({"error": f"{what} {request.method} {request.url.path[:80]}; "
                             f"endpoints: {paths}, ... (docs/serve.md)"},
                            status_code=exc.status_code)

    app = Starlette(routes=routes, exception_handlers={404: no_route, 405: no_route})
    app.router.redirect_slashes = False
    app.state.api = api
    return app
