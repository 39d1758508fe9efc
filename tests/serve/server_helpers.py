"""Start ``ciosl serve`` as a real process on a free loopback port and wait until it answers."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time

import httpx

TOKEN = "test-token-0123456789abcdef"


class Server:
    def __init__(self, folder, *args, token=TOKEN, env=None, wait=True, timeout=120):
        self.folder = folder
        environ = {**os.environ, "CIOSL_TOKEN": token, "OMP_NUM_THREADS": "1", **(env or {})}
        if token is None:
            environ.pop("CIOSL_TOKEN")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ciosl", "serve", "--dir", str(folder), "--port", "0", *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environ)
        self.lines: list[str] = []
        self.err: list[str] = []
        threading.Thread(target=lambda: self.err.extend(self.proc.stderr), daemon=True).start()
        self.url = None
        self.token = token
        if wait:
            self._wait(timeout)

    def _wait(self, timeout):
        deadline = time.monotonic() + timeout
        line = self.proc.stdout.readline()  # the server prints one line once it listens
        self.lines.append(line)
        found = re.search(r"on (http://127\.0\.0\.1:\d+)", line)
        if not found:
            self.proc.kill()
            self.proc.wait(timeout=30)
            time.sleep(0.2)
            raise RuntimeError(f"server did not start: {line!r} {''.join(self.err)!r}")
        self.url = found.group(1)
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/v1/health", timeout=5).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.05)
        raise RuntimeError("server did not answer its health check")

    def client(self, **kw):
        from ciosl import Client

        return Client(self.url, token=self.token, **kw)

    def http(self):
        return httpx.Client(base_url=self.url, timeout=60,
                            headers={"Authorization": f"Bearer {self.token}"})

    def kill(self):
        self.proc.kill()
        self.proc.wait(timeout=60)

    def stop(self):
        self.proc.terminate()
        out = self.proc.wait(timeout=120)
        return out

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.proc.poll() is None:
            self.kill()
