"""``ciosl.Client``: a served learner behind the ``Learner`` calls (``learn_one``, ``learn_many``,
``predict_proba``, ``predict``, ``classes_``), so code written against a learner runs against a
server. Each learn carries an idempotency id; a request that fails in transport (a timeout, a
refused connection, a server restarting) or with 503 is retried with the same id, so it is
learned once however often it is sent."""

from __future__ import annotations

import io
import time
import uuid
from typing import Any

import httpx
import numpy as np


class ServerError(RuntimeError):
    """The server refused a request: its status and its one-line reason."""

    def __init__(self, status: int, message: str):
        super().__init__(f"{status}: {message}")
        self.status = status


# failures of the connection or of the server's side, worth another try with the same id;
# a request this side cannot even send (a bad URL, an illegal header) is not retried
RETRIED = (httpx.NetworkError, httpx.TimeoutException, httpx.RemoteProtocolError)


def _checked_url(url: str) -> str:
    try:
        parsed = httpx.URL(str(url).strip())
    except (httpx.InvalidURL, TypeError, ValueError):
        parsed = None
    if parsed is None or parsed.scheme not in ("http", "https") or not parsed.host:
        raise ValueError(f"Client: {str(url)[:80]!r} is not a URL such as "
                         "http://127.0.0.1:8000")
    return str(parsed).rstrip("/")


def _checked_token(token: str | None) -> str | None:
    """The token without the whitespace around it (a file's last newline); one that holds
    spaces, control or non-ASCII characters is refused, without ever being shown."""
    if token is None:
        return None
    if not isinstance(token, str):
        raise TypeError(f"Client: token must be a string, got {type(token).__name__}")
    token = token.strip()
    if not token or not token.isascii() or not token.isprintable() or " " in token:
        raise ValueError(f"Client: the token ({len(token)} characters, not shown) holds "
                         "spaces, control or non-ASCII characters")
    return token


def _checked_name(name: str) -> str:
    import re

    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_-]{0,63}", name):
        raise ValueError(f"Client: learner {str(name)[:80]!r} is no learner name (1 to 64 of "
                         "A-Z a-z 0-9 _ -, not starting with '-')")
    return name


def _clean(e: Exception) -> str:
    return (str(e).splitlines() or [""])[0][:200]


class Client:
    """``Client("http://127.0.0.1:8000", token=...)``. ``binary``: send features as ``.npy``
    (default; faster than JSON for wide batches) or JSON. ``retries`` transport failures or 503s
    are retried with a growing pause from ``backoff`` seconds."""

    def __init__(self, url: str, *, token: str | None = None, timeout: float = 30.0,
                 retries: int = 8, backoff: float = 0.05, binary: bool = True,
                 learner: str | None = None):
        url = _checked_url(url)
        # the learner NAME's endpoints (/v1/learners/NAME/...); None: today's URLs (default)
        self._base = "/v1" if learner is None else f"/v1/learners/{_checked_name(learner)}"
        token = _checked_token(token)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._token = token  # never shown in a message
        self._http = httpx.Client(base_url=url, headers=headers, timeout=timeout)
        self.retries, self.backoff, self.binary = retries, backoff, binary
        self._classes: list = []

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ transport
    def _send(self, method: str, path: str, **kw) -> dict:
        for attempt in range(self.retries + 1):
            try:
                r = self._http.request(method, path, **kw)
            except RETRIED as e:  # the network or the server, not this request: again
                if attempt == self.retries:
                    why = _clean(e).replace(self._token, "<token>") if self._token else \
                        _clean(e)
                    raise ConnectionError(f"{self._http.base_url}: {type(e).__name__} after "
                                          f"{attempt + 1} tries ({why})") from None
            else:
                if r.status_code != 503 or attempt == self.retries:
                    break
            time.sleep(min(self.backoff * 2**attempt, 2.0))
        body = r.json() if r.headers.get("content-type", "").startswith("application/json") \
            else {"text": r.text}
        if r.status_code not in (200, 201):
            raise ServerError(r.status_code, body.get("error", r.text))
        return body

    def _features(self, Z: Any) -> dict:
        Z = np.asarray(Z, dtype=np.float32)
        if Z.ndim == 1:
            Z = Z[None, :]
        if not self.binary:
            return {"json": {"x": Z.tolist()}}
        buf = io.BytesIO()
        np.save(buf, Z, allow_pickle=False)
        return {"content": buf.getvalue(), "headers": {"Content-Type": "application/x-npy"}}

    # ------------------------------------------------------------------ the Learner calls
    def learn_many(self, Z: Any, y: Any, *, id: str | None = None) -> dict:
        """Learn a batch once (retried with one id); the server's answer."""
        labels = [v.item() if isinstance(v, np.generic) else v for v in np.asarray(
            y, dtype=object).reshape(-1)]
        rid = id or uuid.uuid4().hex
        req = self._features(Z)
        if "json" in req:
            req["json"].update(y=labels, id=rid)
        else:
            import json

            req["headers"].update({"X-Ciosl-Labels": json.dumps(labels), "X-Ciosl-Id": rid})
        return self._send("POST", f"{self._base}/learn", **req)

    def learn_one(self, z: Any, y: Any, *, id: str | None = None) -> None:
        self.learn_many(np.asarray(z, dtype=np.float32).reshape(1, -1), [y], id=id)

    def _predict(self, Z: Any, min_seq: int | None) -> dict:
        """``min_seq``: answered once the server has applied that record (the ``seq`` of an
        earlier learn's answer: read your own writes), else 503 after ``--min-seq-wait``."""
        params = {} if min_seq is None else {"params": {"min_seq": int(min_seq)}}
        return self._send("POST", f"{self._base}/predict", **self._features(Z), **params)

    def predict_proba(self, Z: Any, *, min_seq: int | None = None) -> np.ndarray:
        body = self._predict(Z, min_seq)
        self._classes = body["classes"]
        return np.asarray(body["proba"], dtype=np.float64)

    def predict(self, Z: Any, *, min_seq: int | None = None) -> np.ndarray:
        body = self._predict(Z, min_seq)
        self._classes = body["classes"]
        return np.asarray(body["label"])

    def predict_one(self, z: Any) -> Any:
        return self.predict(np.asarray(z, dtype=np.float32).reshape(1, -1))[0].item()

    @property
    def classes_(self) -> list:
        return self._send("GET", f"{self._base}/classes")["classes"]

    # ------------------------------------------------------------------ the server's own
    def health(self) -> dict:
        return self._send("GET", "/v1/health")

    def state(self) -> dict:
        return self._send("GET", f"{self._base}/state")

    def snapshot(self) -> dict:
        return self._send("POST", f"{self._base}/snapshot")

    def metrics(self) -> str:
        return self._send("GET", "/metrics")["text"]

    # ------------------------------------------------------------------ feedback, many learners
    def predict_ids(self, Z: Any, *, min_seq: int | None = None) -> dict:
        """The whole answer: classes, proba, label, prediction_id, novelty, novel, seq."""
        return self._predict(Z, min_seq)

    def feedback(self, prediction_id: str | list, y: Any) -> dict:
        """Learn the features of earlier predictions with their true labels (exactly once per
        prediction id: a retry is answered as a duplicate)."""
        return self._send("POST", f"{self._base}/feedback",
                          json={"prediction_id": prediction_id, "y": y})

    def live(self) -> dict:
        """The learner's live score (``GET .../metrics``)."""
        name = "default" if self._base == "/v1" else self._base.rsplit("/", 1)[1]
        return self._send("GET", f"/v1/learners/{name}/metrics")

    def learners(self) -> list[dict]:
        return self._send("GET", "/v1/learners")["learners"]

    def create(self, name: str, method: str, **settings: Any) -> dict:
        return self._send("POST", "/v1/learners", json={"name": name, "method": method,
                                                         "settings": settings})

    # ------------------------------------------------------------------ images (--extractor)
    def _images(self, images: Any) -> dict:
        """A uint8 array (n, h, w, 3) (or one (h, w, 3) frame) as a raw-frame ``.npy`` body;
        a list of encoded files (bytes, or paths to PNG / JPEG / WebP files) as base64 JSON."""
        if isinstance(images, np.ndarray):
            if images.dtype != np.uint8:
                raise ValueError(f"images: dtype {images.dtype}; frames are uint8 (n, h, w, 3)"
                                 " (encoded files go as a list of bytes or paths)")
            frames = images[None] if images.ndim == 3 else images
            if frames.ndim != 4 or frames.shape[-1] != 3:
                raise ValueError(f"images: shape {images.shape}; frames are (n, h, w, 3)")
            buf = io.BytesIO()
            np.save(buf, np.ascontiguousarray(frames), allow_pickle=False)
            return {"content": buf.getvalue(), "headers": {"Content-Type": "application/x-npy"}}
        import base64
        from pathlib import Path

        if isinstance(images, bytes | str | Path):
            images = [images]
        blobs = [b if isinstance(b, bytes) else Path(b).read_bytes() for b in images]
        return {"json": {"images": [base64.b64encode(b).decode("ascii") for b in blobs]}}

    def learn_images(self, images: Any, y: Any, *, id: str | None = None) -> dict:
        """Learn images (frames or encoded files, see ``_images``) once, retried with one id."""
        labels = [v.item() if isinstance(v, np.generic) else v for v in np.asarray(
            y, dtype=object).reshape(-1)]
        rid = id or uuid.uuid4().hex
        req = self._images(images)
        if "json" in req:
            req["json"].update(y=labels, id=rid)
        else:
            import json

            req["headers"].update({"X-Ciosl-Labels": json.dumps(labels), "X-Ciosl-Id": rid})
        return self._send("POST", f"{self._base}/learn", **req)

    def predict_images(self, images: Any) -> dict:
        """The whole answer for images: classes, proba, label, prediction_id, ..., seq."""
        body = self._send("POST", f"{self._base}/predict", **self._images(images))
        self._classes = body["classes"]
        return body
