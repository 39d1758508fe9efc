"""``ciosl serve``: recover the folder's learner, then run the API under uvicorn until SIGINT or
SIGTERM; on a clean stop the queued learns are applied and a last snapshot is taken."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import sys
from pathlib import Path

from ciosl.fileio import read_text
from ciosl.serve.app import Limits, build_app
from ciosl.serve.service import Options, ServeError, Service, settings_for

MIN_TOKEN = 16


class _Stopped(Exception):
    pass


def _stop(signum, frame):
    raise _Stopped


def resolve_token(token_file: str | None, folder: Path) -> tuple[str, str]:
    """The token and where it came from: ``--token-file``, ``$CIOSL_TOKEN``, else ``DIR/token``
    (made with a random token, mode 0600, when absent)."""
    if token_file is not None:
        token = read_text(Path(token_file).expanduser(), "--token-file", limit=4096).strip()
        where = f"--token-file {token_file}"
    elif os.environ.get("CIOSL_TOKEN"):
        token, where = os.environ["CIOSL_TOKEN"].strip(), "$CIOSL_TOKEN"
    else:
        path = folder / "token"
        if not path.exists():
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_urlsafe(32) + "\n")
        elif path.stat().st_mode & 0o077:
            raise ServeError(f"{path}: readable by others (mode "
                             f"{oct(path.stat().st_mode & 0o777)}); chmod 600 it")
        token, where = read_text(path, "token file", limit=4096).strip(), str(path)
    if len(token) < MIN_TOKEN or any(c.isspace() for c in token):
        raise ServeError(f"{where}: a token needs at least {MIN_TOKEN} characters and no spaces")
    return token, where


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
          limits: Limits | None = None) -> int:
    import uvicorn

    settings = None
    if method is not None:
        settings = settings_for(method, overrides)
    elif overrides:
        raise ServeError("--set needs --method")
    embedder = None
    if extractor is not None:
        from ciosl.serve.images import Embedder

        embedder = Embedder(extractor)  # checked and loaded before the folder is touched
    sock = bind(host, port)
    service = Service(folder, method, settings, options=options).open()
    try:
        token, where = resolve_token(token_file, Path(folder))
        app = build_app(service, token, limits, embedder)
        config = uvicorn.Config(app, log_level="warning", access_log=False,
                                timeout_graceful_shutdown=30)
        server = uvicorn.Server(config)
        addr = sock.getsockname()
        s = service.status()
        print(f"ciosl serve: {s['method']} on http://{host}:{addr[1]} (seen {s['seen']}, "
              f"{s['classes']} classes, {service.recovered} log records replayed in "
              f"{service.recovery_seconds:.2f} s); token: {where}", flush=True)
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
        service.close()
        sock.close()
    print("ciosl serve: stopped; every acknowledged learn is in the snapshot or the log",
          file=sys.stderr, flush=True)
    return 0


def serve_command(folder: str, method: str | None, overrides: dict[str, str], *,
                  snapshot_every: int, snapshot_seconds: float, max_batch: int, max_body: int,
                  writer_nice: int = 10, **kw) -> int:
    """``ciosl serve``'s flags, checked, then ``serve``."""
    if snapshot_every < 0:
        raise ServeError(f"--snapshot-every must be >= 0, got {snapshot_every}")
    if not snapshot_seconds >= 0:
        raise ServeError(f"--snapshot-seconds must be >= 0, got {snapshot_seconds}")
    if not 1 <= max_batch <= 1 << 20:
        raise ServeError(f"--max-batch must be in 1..{1 << 20}, got {max_batch}")
    if not 1024 <= max_body <= 1 << 32:
        raise ServeError(f"--max-body must be in 1024..{1 << 32}, got {max_body}")
    if not 0 <= writer_nice <= 19:
        raise ServeError(f"--writer-nice must be in 0..19, got {writer_nice}")
    return serve(folder, method, overrides,
                 options=Options(snapshot_every=snapshot_every,
                                 snapshot_seconds=snapshot_seconds,
                                 writer_nice=writer_nice),
                 limits=Limits(max_body=max_body, max_rows=max_batch), **kw)
