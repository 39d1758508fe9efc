"""``ciosl serve``: open the folder of learners (``hub.py``), then run the API under uvicorn until
SIGINT or SIGTERM; on a clean stop every loaded learner applies its queued learns and takes a
last snapshot."""

from __future__ import annotations

import math
import os
import secrets
import signal
import socket
import sys
from pathlib import Path

from ciosl.fileio import dangling_text, read_text
from ciosl.serve.app import Limits, build_app
from ciosl.serve.guard import Guard, open_files_limit
from ciosl.serve.hub import DEFAULT, Hub
from ciosl.serve.service import Options, ServeError, settings_for

MIN_TOKEN = 16


class _Stopped(Exception):
    pass


def _stop(signum, frame):
    raise _Stopped


def resolve_token(token_file: str | None, folder: Path) -> tuple[str, str]:
    """The token and where it came from: ``--token-file``, ``$CIOSL_TOKEN``, else ``DIR/token``
    (made with a random token, mode 0600, when absent)."""
    if token_file is not None:
        path = Path(token_file).expanduser()
        if os.path.islink(path) and not path.exists():
            raise ServeError(f"--token-file {dangling_text(path)}")
        _private(path, f"--token-file {token_file}")
        token = read_text(path, "--token-file", limit=4096).strip()
        where = f"--token-file {token_file}"
    elif os.environ.get("CIOSL_TOKEN"):
        token, where = os.environ["CIOSL_TOKEN"].strip(), "$CIOSL_TOKEN"
    else:
        path = folder / "token"
        if os.path.islink(path) and not path.exists():
            raise ServeError(dangling_text(path) + "; remove it, or give --token-file")
        if not path.exists():
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_urlsafe(32) + "\n")
        else:
            _private(path, str(path))
        token, where = read_text(path, "token file", limit=4096).strip(), str(path)
    if len(token) < MIN_TOKEN or any(c.isspace() for c in token):
        raise ServeError(f"{where}: a token needs at least {MIN_TOKEN} characters and no spaces")
    return token, where


def _private(path: Path, where: str) -> None:
    """A token file that others can read or write is refused (the same rule for
    ``--token-file`` as for ``DIR/token``)."""
    try:
        mode = path.stat().st_mode
    except OSError as e:
        raise ServeError(f"{where}: cannot read it ({e.strerror or e})") from None
    if mode & 0o077:
        raise ServeError(f"{where}: readable or writable by others (mode "
                         f"{oct(mode & 0o777)}); chmod 600 it")


def url_of(host: str, port: int) -> str:
    """``http://HOST:PORT``, an IPv6 address in brackets (``http://[::1]:8000``)."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def bind(host: str, port: int) -> socket.socket:
    if not 0 <= port <= 65535:
        raise ServeError(f"--port must be in 0..65535, got {port}")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # accepted connections inherit it: a response written in two parts (head, body) must not
    # wait for the client's delayed ACK (40 ms per request on a kept-alive connection)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise ServeError(f"--host {host} --port {port}: cannot listen there ({e.strerror})") \
            from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def serve(folder: str, method: str | None, overrides: dict[str, str], *,
          host: str = "127.0.0.1", port: int = 8000, token_file: str | None = None,
          extractor: str | None = None, options: Options | None = None,
          limits: Limits | None = None, max_connections: int = 1000,
          header_timeout: float = 30.0, max_loaded: int = 256,
          unload_after: float = 600.0, device: str | None = None, backend: str | None = None,
          threads: int | None = None, batch_images: int | None = None,
          batch_wait_ms: float = 2.0) -> int:
    import uvicorn

    settings = None
    if method is not None:
        settings = settings_for(method, overrides)
    elif overrides:
        raise ServeError("--set needs --method")
    embedder = None
    if extractor is not None:  # checked and loaded before the folder is touched
        from ciosl.serve.images import open_embedder, pin_extractor

        embedder = open_embedder(extractor, device, backend, threads, batch_images,
                                 batch_wait_ms)
    elif device is not None or backend is not None or batch_images is not None:
        flag = "--device" if device is not None else (
            "--backend" if backend is not None else "--batch-images")
        raise ServeError(f"{flag}: sets where the images' extractor runs; give --extractor")
    nofile = open_files_limit()
    if max_connections > nofile - 64:
        raise ServeError(f"--max-connections {max_connections}: the open-file limit is "
                         f"{nofile} (ulimit -n); at most {max(nofile - 64, 1)}")
    sock = bind(host, port)
    early = None  # a token given (file or environment) is checked before the folder is touched
    if token_file is not None or os.environ.get("CIOSL_TOKEN"):
        try:
            early = resolve_token(token_file, Path(folder))
        except BaseException:
            sock.close()
            raise
    try:
        hub = _hub_class(options)(folder, options, max_loaded=max_loaded,
                                  unload_after=unload_after).open(method, settings)
    except BaseException:
        sock.close()
        raise
    try:
        if embedder is not None:
            pin_extractor(Path(folder), embedder.extractor.pin())
        token, where = early or resolve_token(token_file, Path(folder))
        app = build_app(hub, token, limits, embedder, extractor)
        guard = Guard(max_connections, header_timeout)
        config = uvicorn.Config(app, log_level="warning", access_log=False,
                                timeout_graceful_shutdown=30, http=guard.protocol(),
                                timeout_keep_alive=max(1, int(header_timeout)))
        server = uvicorn.Server(config)
        app.state.api.stopping = lambda: server.should_exit  # open event streams end
        addr = sock.getsockname()
        names = hub.names()
        entry = hub._entries.get(DEFAULT)
        if entry is not None and entry.service is not None:
            service = entry.service
            s = service.status()
            what = (f"{s['method']} on {url_of(host, addr[1])} (seen {s['seen']}, "
                    f"{s['classes']} classes, {service.recovered} log records replayed in "
                    f"{service.recovery_seconds:.2f} s)")
        else:
            what = f"on {url_of(host, addr[1])}"
        log = f"; log: {hub.log.text}" if hasattr(hub, "log") else ""  # no password said
        print(f"ciosl serve: {what}; {len(names)} learner(s), loaded on demand and unloaded "
              f"after {unload_after:g} s idle (at most {max_loaded} loaded); token: {where}"
              f"{log}", flush=True)
        if host not in ("127.0.0.1", "::1", "localhost"):
            print(f"ciosl serve: warning: --host {host} listens beyond this machine, over "
                  "plain HTTP; the token guards every endpoint but /v1/health (put TLS in "
                  "front of it)", file=sys.stderr, flush=True)
        # uvicorn stops gracefully on SIGINT / SIGTERM, then raises the signal again under the
        # handlers it found: these, so that the queued learns are applied and a snapshot taken
        previous = {sig: signal.signal(sig, _stop) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            server.run(sockets=[sock])
        except _Stopped:
            pass
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    finally:
        hub.close()
        sock.close()
        if embedder is not None:
            embedder.close()
    print("ciosl serve: stopped; every acknowledged learn is in the snapshot or the log",
          file=sys.stderr, flush=True)
    return 0


def _hub_class(options: Options | None) -> type[Hub]:
    """The folder log's hub, or the JetStream one for ``--log nats://...``."""
    if options is None or options.log == "folder":
        return Hub
    try:
        import nats  # noqa: F401
    except ImportError:
        raise ServeError("--log nats://...: needs nats-py (pip install 'ciosl[nats]')") \
            from None
    from ciosl.serve.stream_hub import StreamHub

    return StreamHub


def serve_command(folder: str, method: str | None, overrides: dict[str, str], *,
                  snapshot_every: int, snapshot_seconds: float, max_batch: int, max_body: int,
                  writer_nice: int = 10, max_json_body: int = 16 << 20,
                  max_pixels: int = 64 << 20, body_timeout: float = 30.0,
                  header_timeout: float = 30.0, max_connections: int = 1000,
                  id_window: int = 1_000_000, id_window_bytes: int = 64 << 20,
                  feedback_window: int = 10_000, max_loaded: int = 256,
                  unload_after: float = 600.0, answer_every_ms: float = 0.0,
                  log: str = "folder", log_replicas: int | None = None,
                  log_dedupe_window: float = 120.0, min_seq_wait: float = 5.0, **kw) -> int:
    """``ciosl serve``'s flags, checked (each named, in one line), then ``serve``."""
    options = Options(snapshot_every=snapshot_every, snapshot_seconds=snapshot_seconds,
                      writer_nice=writer_nice, id_window=id_window,
                      id_window_bytes=id_window_bytes, feedback_window=feedback_window,
                      answer_every_ms=answer_every_ms, log=log, log_replicas=log_replicas,
                      log_dedupe_window=log_dedupe_window, min_seq_wait=min_seq_wait)
    for flag, value, lo, hi in (("--max-batch", max_batch, 1, 1 << 20),
                                ("--max-body", max_body, 1024, 1 << 32),
                                ("--max-json-body", max_json_body, 1024, 1 << 30),
                                ("--max-pixels", max_pixels, 1, 1 << 32),
                                ("--max-connections", max_connections, 1, 1 << 20),
                                ("--max-loaded", max_loaded, 1, 1 << 20),
                                ("--unload-after", unload_after, 0.1, 30 * 86400),
                                ("--body-timeout", body_timeout, 0.1, 3600),
                                ("--header-timeout", header_timeout, 0.1, 3600)):
        if not (math.isfinite(value) and lo <= value <= hi):
            raise ServeError(f"{flag} must be in {lo}..{hi}, got {value}")
    return serve(folder, method, overrides, options=options, max_connections=max_connections,
                 header_timeout=header_timeout, max_loaded=max_loaded,
                 unload_after=unload_after,
                 limits=Limits(max_body=max_body, max_rows=max_batch,
                               max_json_body=min(max_json_body, max_body),
                               max_pixels=max_pixels, body_seconds=body_timeout,
                               max_inflight=4 * max_body), **kw)
