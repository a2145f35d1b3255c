"""A real OCI registry for the tests (Debian's docker-registry on 127.0.0.1) and a small proxy in
front of it that counts requests and injects faults (127.0.0.1 only).

The proxy forwards each request to the registry with the client's Host header, so the absolute
upload locations the registry answers with point back at the proxy. Faults apply to GETs of
blobs (or of manifests, for `slow_manifest`): `truncate` promises the whole body and sends half
then closes, `corrupt` flips one byte, `slow` waits before answering.
"""

from __future__ import annotations

import http.client
import http.server
import os
import shutil
import socket
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

REGISTRY_BIN = shutil.which("docker-registry") or "/usr/bin/docker-registry"
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-authenticate",
              "proxy-authorization", "content-length"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalRegistry:
    """docker-registry serving `folder` on 127.0.0.1 (plain HTTP), stopped by stop()."""

    def __init__(self, folder: Path) -> None:
        self.port = free_port()
        self.host = f"127.0.0.1:{self.port}"
        config = folder / "config.yml"
        folder.mkdir(parents=True, exist_ok=True)
        config.write_text(
            "version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\n"
            f"storage:\n  filesystem:\n    rootdirectory: {folder / 'data'}\n"
            f"http:\n  addr: 127.0.0.1:{self.port}\n"
        )
        self.log = open(folder / "registry.log", "wb")
        self.proc = subprocess.Popen([REGISTRY_BIN, "serve", str(config)], stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while True:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=1)
                conn.request("GET", "/v2/")
                if conn.getresponse().status == 200:
                    return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"docker-registry did not start: {(folder / 'registry.log').read_text()[-2000:]}")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def _kind(method: str, path: str) -> str:
    if "/manifests/" in path:
        return f"{method} manifest"
    if "/blobs/uploads" in path:
        return f"{method} upload"
    if "/blobs/" in path:
        return f"{method} blob"
    return f"{method} other"


class _QuietServer(http.server.ThreadingHTTPServer):
    """Clients closing kept-alive connections (or the proxy cutting one on purpose) are normal
    here: socketserver would print each as a traceback into the test's captured output."""

    def handle_error(self, request, client_address) -> None:  # type: ignore[no-untyped-def]
        import sys

        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class Proxy:
    """A counting, fault-injecting HTTP proxy on 127.0.0.1 in front of `upstream` (host:port)."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.counts: Counter[str] = Counter()
        self.fault: str | None = None  # truncate | corrupt | slow | slow_manifest
        self.slow_seconds = 3.0
        self._lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                with proxy._lock:
                    proxy.counts[_kind(self.command, self.path)] += 1
                host, port = proxy.upstream.rsplit(":", 1)
                conn = http.client.HTTPConnection(host, int(port), timeout=30)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
                conn.request(self.command, self.path, body=body, headers=headers)
                answer = conn.getresponse()
                data = answer.read()
                conn.close()
                kind = _kind(self.command, self.path)
                fault = proxy.fault if answer.status == 200 else None
                if fault == "slow" and kind == "GET blob" or fault == "slow_manifest" and kind == "GET manifest":
                    time.sleep(proxy.slow_seconds)
                if fault == "corrupt" and kind == "GET blob" and data:
                    middle = len(data) // 2
                    data = data[:middle] + bytes([data[middle] ^ 0x40]) + data[middle + 1:]
                self.send_response(answer.status, answer.reason)
                for name, value in answer.getheaders():
                    if name.lower() not in HOP_BY_HOP:
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                if fault == "truncate" and kind == "GET blob":
                    self.send_header("Connection", "close")
                    self.end_headers()
                    self.wfile.write(data[: len(data) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_HEAD = do_PUT = do_POST = do_PATCH = do_DELETE = _forward

        self.server = _QuietServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.host = f"127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def reset(self) -> None:
        with self._lock:
            self.counts.clear()
        self.fault = None

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def registry_available() -> str | None:
    """None when the registry binary is installed, else why the tests skip."""
    if not os.access(REGISTRY_BIN, os.X_OK):
        return ("Debian's docker-registry is not installed (bash scripts/setup.sh installs it; "
                "apt-get install docker-registry)")
    return None


# -- fixtures (imported by the tests/cache/oci/ modules) ------------------------------------

import itertools  # noqa: E402

import pytest  # noqa: E402

_REPOS = itertools.count()


@pytest.fixture(scope="module")
def oci_registry(tmp_path_factory):
    """One docker-registry for the module; skipped only where the binary is absent, and never in CI
    (CI=true), where scripts/setup.sh must have installed it."""
    reason = registry_available()
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the registry tests: {reason}")
        pytest.skip(reason)
    registry = LocalRegistry(tmp_path_factory.mktemp("registry"))
    yield registry
    registry.stop()


@pytest.fixture
def oci_proxy(oci_registry):
    proxy = Proxy(oci_registry.host)
    yield proxy
    proxy.stop()


def new_ref(proxy: Proxy, tag: str = "t") -> str:
    """A reference to a repository no other test uses, through the proxy."""
    return f"{proxy.host}/mono-jit/case{next(_REPOS)}-{os.getpid()}:{tag}"


def pushed(proxy: Proxy, cache) -> str:
    """A new reference holding `cache`'s entries (pushed through the CLI), the proxy's counts reset."""
    from click.testing import CliRunner

    from mono_jit.cli import main

    ref = new_ref(proxy)
    result = CliRunner().invoke(main, ["push", ref, "--insecure", "--cache-dir", str(cache)])
    assert result.exit_code == 0, result.output
    proxy.reset()
    return ref


def remote_env(proxy: Proxy, ref: str, **extra: str) -> dict[str, str]:
    """MONO_JIT_* settings for the read-through tier through `proxy` (plain HTTP: named insecure)."""
    return {"MONO_JIT_REMOTE": ref, "MONO_JIT_REMOTE_INSECURE": proxy.host, **extra}
