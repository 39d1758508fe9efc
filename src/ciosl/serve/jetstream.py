"""The connection to NATS JetStream (``ciosl serve --log nats://HOST:PORT[,HOST:PORT...]``).

One asyncio loop in a daemon thread per process runs one nats-py client, connected to every
server given and reconnecting forever; the rest of the server (threads) calls it through the
synchronous wrappers here: streams (ensure, publish with a message id, ordered delivery into a
queue, purge, info), the key-value bucket of the learners and the object store of snapshots.
nats-py does the work (JetStream publish with ``Nats-Msg-Id``, ordered consumers, KV, object
store); this module only carries calls between threads and the loop."""

from __future__ import annotations

import asyncio
import contextlib
import queue
import socket
import threading
from dataclasses import dataclass

from ciosl.serve.folder import ServeError

KV_BUCKET = "ciosl_learners"
OBJ_BUCKET = "ciosl_snapshots"
CONNECT_SECONDS = 10.0
RETRY_SECONDS = 0.1  # between two tries of a publish that found no stream leader
# one try of a publish waits this long for its acknowledgement, then tries again with the same
# id (a reply lost with a NATS server that died is not waited for until the request's end)
TRY_SECONDS = 1.0
HEARTBEAT_SECONDS = 0.5  # an ordered consumer missing two is made again
START_SECONDS = 60.0  # a replica starting waits this long for JetStream to answer
QUEUED = 1024  # records delivered and not yet applied, at most (memory stays bounded)


def parse_log(value: str) -> list[str]:
    """The server URLs of ``--log nats://HOST:PORT[,HOST:PORT...]`` (each ``nats://H:P``);
    ``ServeError`` naming ``--log`` and the value."""
    text = str(value)
    shown = ",".join(_shown(p.strip()) for p in text.split(","))[:80]  # no password said
    if not text.startswith("nats://"):
        raise ServeError(f"--log {shown}: expected 'folder' or nats://HOST:PORT[,HOST:PORT"
                         "...]")
    urls = []
    for part in text.split(","):
        part = part.strip()
        hostport = part[len("nats://"):] if part.startswith("nats://") else part
        host, _, port = hostport.rpartition("@")[2].rpartition(":")
        host = host.strip("[]")
        if not host or not port.isdigit() or not 0 < int(port) < 65536 or "/" in hostport:
            raise ServeError(f"--log {shown}: {_shown(part)[:60]!r} is not HOST:PORT "
                             "(expected nats://HOST:PORT[,HOST:PORT...])")
        urls.append(f"nats://{hostport}")
    return urls


@dataclass
class Delivery:
    """Where an ordered delivery of a stream goes: ``(stream seq, payload, msg id)`` items in
    ``queue``; ``stop()`` ends it."""

    queue: queue.Queue
    sub: object = None
    log: Log | None = None

    def stop(self) -> None:
        if self.sub is not None and self.log is not None:
            with contextlib.suppress(Exception):
                self.log.call(self.sub.unsubscribe(), 5)
            self.sub = None


class Log:
    """A JetStream connection: ``Log(urls, replicas, dedupe_window).connect()``."""

    def __init__(self, urls: list[str], replicas: int = 1, dedupe_window: float = 120.0,
                 *, timeout: float = 5.0, warn=None):
        self.urls, self.replicas, self.dedupe_window = list(urls), int(replicas), dedupe_window
        self.timeout = timeout  # each JetStream API call
        self.warn = warn
        # as said in lines and errors: a URL's credentials (user:password@) never printed
        self.text = "nats://" + ",".join(_shown(u[len("nats://"):]) for u in self.urls)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="ciosl-nats", daemon=True)
        self.nc = self.js = self.kv = self.obs = None

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def call(self, coro, timeout: float | None = None):
        """Run ``coro`` on the loop and wait for it (``TimeoutError`` after ``timeout``)."""
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result(timeout if timeout is not None else self.timeout + 5)
        except TimeoutError:
            fut.cancel()
            raise

    def submit(self, coro):
        """Schedule ``coro`` on the loop; its ``concurrent.futures.Future``."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    # ------------------------------------------------------------------ connecting
    def connect(self) -> Log:
        """Connect (a server that answers none of the URLs fails at once, naming them), make
        the learners' bucket and the snapshots' store when absent."""
        reachable = []
        for url in self.urls:
            host, _, port = url[len("nats://"):].rpartition("@")[2].rpartition(":")
            try:
                socket.create_connection((host.strip("[]"), int(port)), timeout=2).close()
                reachable.append(url)
            except OSError as e:
                why = e.strerror or type(e).__name__
        if not reachable:
            raise ServeError(f"--log {self.text}: no NATS server answers there ({why})")
        self._thread.start()
        try:
            self.call(self._connect(), CONNECT_SECONDS + START_SECONDS + 10)
        except Exception as e:
            self.close()
            raise ServeError(f"--log {self.text}: cannot use JetStream there "
                             f"({_line(e)})") from None
        return self

    async def _connect(self) -> None:
        import nats

        async def quiet(*_a):  # nats-py's default callbacks log tracebacks: one line at most
            return None

        async def error(e):
            if self.warn is not None and not isinstance(e, OSError | asyncio.TimeoutError):
                self.warn(f"ciosl serve: the log {self.text}: {_line(e)}")

        self.nc = await asyncio.wait_for(nats.connect(
            servers=self.urls, allow_reconnect=True, max_reconnect_attempts=-1,
            reconnect_time_wait=0.25, connect_timeout=2, ping_interval=5,
            max_outstanding_pings=2, error_cb=error, disconnected_cb=quiet,
            reconnected_cb=quiet, closed_cb=quiet), CONNECT_SECONDS)
        self.js = self.nc.jetstream(timeout=self.timeout)
        deadline = self.loop.time() + START_SECONDS
        while True:  # a cluster electing its leader (a server down) answers in a while
            try:
                self.kv = await self._bucket(self.js.create_key_value, self.js.key_value,
                                             KV_BUCKET, history=1)
                self.obs = await self._bucket(self.js.create_object_store,
                                              self.js.object_store, OBJ_BUCKET)
                return
            except Exception as e:
                if not transient(e) or self.loop.time() > deadline:
                    raise
            await asyncio.sleep(0.5)

    async def _bucket(self, create, bind, name: str, **kw):
        from nats.js.errors import BucketNotFoundError

        try:
            return await bind(name)
        except BucketNotFoundError:
            pass
        try:
            return await create(bucket=name, replicas=self.replicas, storage="file", **kw)
        except Exception:  # made meanwhile by another replica
            return await bind(name)

    def close(self) -> None:
        """Close the connection, end what still runs on the loop (nats-py's consumer
        heartbeat checks), stop the loop."""
        async def shutdown():
            if self.nc is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self.nc.close(), 10)
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        if self._thread.is_alive():
            with contextlib.suppress(Exception):
                self.call(shutdown(), 20)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)

    def connected(self) -> bool:
        return self.nc is not None and self.nc.is_connected

    # ------------------------------------------------------------------ streams
    def ensure_stream(self, stream: str, subject: str) -> None:
        """The stream ``stream`` on ``subject`` (file storage, ``replicas``, the dedupe
        window), made when absent."""
        from nats.js.api import StorageType, StreamConfig

        async def go():
            from nats.js.errors import NotFoundError

            try:
                await self.js.stream_info(stream)
            except NotFoundError:
                await self.js.add_stream(StreamConfig(
                    name=stream, subjects=[subject], storage=StorageType.FILE,
                    num_replicas=self.replicas, duplicate_window=self.dedupe_window))
        self.call(go())

    async def publish(self, subject: str, stream: str, payload: bytes, msg_id: str,
                      timeout: float) -> tuple[int, bool]:
        """(on the loop) Publish with ``Nats-Msg-Id``: (the stream seq, whether JetStream
        took it as a duplicate of an earlier message with that id). A try whose answer does
        not come within ``TRY_SECONDS`` is made again with the same id; JetStream answering
        that again as a duplicate means the first try landed, so only the first try's
        duplicate is reported as one."""
        from nats.errors import NoRespondersError
        from nats.errors import TimeoutError as NatsTimeout
        from nats.js.errors import NoStreamResponseError, ServiceUnavailableError

        deadline = self.loop.time() + timeout
        first = True
        while True:  # retried with the same id while time is left: JetStream drops a double
            left = deadline - self.loop.time()
            try:
                ack = await self.js.publish(subject, payload,
                                            timeout=max(0.05, min(TRY_SECONDS, left)),
                                            stream=stream, headers={"Nats-Msg-Id": msg_id})
                return int(ack.seq), bool(ack.duplicate) and first
            except (NatsTimeout, asyncio.TimeoutError):  # no answer: it may have landed
                if deadline - self.loop.time() < RETRY_SECONDS:
                    raise
                first = False
            except (NoStreamResponseError, NoRespondersError, ServiceUnavailableError):
                if deadline - self.loop.time() < RETRY_SECONDS:  # no stream leader yet
                    raise
            await asyncio.sleep(RETRY_SECONDS)

    def publish_sync(self, subject: str, stream: str, payload: bytes, msg_id: str,
                     timeout: float = 5.0) -> tuple[int, bool]:
        return self.call(self.publish(subject, stream, payload, msg_id, timeout), timeout + 5)

    def deliver(self, stream: str, subject: str, start: int, into: queue.Queue) -> Delivery:
        """An ordered consumer of ``stream`` from seq ``start``: each message put in ``into``
        as ``(seq, payload, msg id)``, in order (nats-py's ordered consumer resets itself
        after a gap or missed heartbeats, from the last seq delivered)."""
        from nats.js.api import ConsumerConfig, DeliverPolicy

        delivery = Delivery(into, None, self)

        async def cb(msg):
            seq = msg.metadata.sequence.stream
            mid = (msg.headers or {}).get("Nats-Msg-Id")
            while into.qsize() >= QUEUED and delivery.sub is not None:  # the applier is
                await asyncio.sleep(0.005)  # behind: flow control holds the rest back
            into.put((seq, msg.data, mid))

        async def go():
            return await self.js.subscribe(
                subject, stream=stream, cb=cb, ordered_consumer=True,
                idle_heartbeat=HEARTBEAT_SECONDS,
                config=ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                                      opt_start_seq=max(1, int(start))))
        delivery.sub = self.call(go())
        jsi = getattr(delivery.sub, "_jsi", None)
        if jsi is not None and getattr(jsi, "_sseq", None) == 0:  # a reset before the first
            jsi._sseq = max(0, int(start) - 1)  # message resumes at start, not at seq 1
        return delivery

    def stream_info(self, stream: str) -> dict:
        """``{"messages", "first_seq", "last_seq"}`` of ``stream``."""
        info = self.call(self.js.stream_info(stream))
        s = info.state
        return {"messages": s.messages, "first_seq": s.first_seq, "last_seq": s.last_seq}

    def purge_below(self, stream: str, seq: int) -> None:
        """Remove the messages of ``stream`` numbered below ``seq`` (``seq`` itself stays)."""
        if seq > 1:
            self.call(self.js.purge_stream(stream, seq=int(seq)))

    # ------------------------------------------------------------------ the learners' bucket
    def kv_create(self, key: str, value: bytes) -> bool:
        """Create ``key``; False when it exists already."""
        from nats.js.errors import KeyWrongLastSequenceError

        try:
            self.call(self.kv.create(key, value))
            return True
        except KeyWrongLastSequenceError:
            return False

    def kv_get(self, key: str, timeout: float | None = None) -> bytes | None:
        from nats.js.errors import KeyDeletedError, KeyNotFoundError

        try:
            entry = self.call(self.kv.get(key), timeout)
        except (KeyNotFoundError, KeyDeletedError):
            return None
        return entry.value

    def kv_keys(self, timeout: float | None = None) -> list[str]:
        from nats.js.errors import NoKeysError

        try:
            return sorted(self.call(self.kv.keys(), timeout))
        except NoKeysError:
            return []

    def kv_delete(self, key: str) -> None:
        self.call(self.kv.delete(key))

    # ------------------------------------------------------------------ the snapshots' store
    def obj_put(self, name: str, data: bytes, description: str) -> None:
        from nats.js.api import ObjectMeta

        self.call(self.obs.put(name, data, meta=ObjectMeta(name=name, description=description)),
                  self.timeout * 4 + 5)

    def obj_get(self, name: str) -> tuple[bytes, str | None]:
        """(the object's bytes, its description)."""
        res = self.call(self.obs.get(name), self.timeout * 4 + 5)
        return bytes(res.data), res.info.description

    def obj_list(self, prefix: str = "") -> list[str]:
        from nats.js.errors import NotFoundError

        async def go():
            try:
                infos = await self.obs.list(ignore_deletes=True)
            except NotFoundError:  # an empty store
                return []
            return [i.name for i in infos if not i.deleted and i.name.startswith(prefix)]
        return sorted(self.call(go()))

    def obj_delete(self, name: str) -> None:
        self.call(self.obs.delete(name))


def transient(e: BaseException) -> bool:
    """Whether ``e`` is JetStream being away for a while (no answer, no responder, no leader
    yet), which a later try may not meet."""
    from nats.errors import ConnectionClosedError, NoRespondersError
    from nats.errors import TimeoutError as NatsTimeout
    from nats.js.errors import NoStreamResponseError, ServiceUnavailableError

    return isinstance(e, TimeoutError | asyncio.TimeoutError | NatsTimeout | NoRespondersError
                      | ServiceUnavailableError | NoStreamResponseError | ConnectionClosedError)


def _shown(hostport: str) -> str:
    """``[nats://]HOST:PORT`` with any ``user:password@`` before the host shown as ``***@``."""
    scheme = "nats://" if hostport.startswith("nats://") else ""
    creds, at, rest = hostport[len(scheme):].rpartition("@")
    return f"{scheme}***@{rest}" if at else hostport


def _line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__
