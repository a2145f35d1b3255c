"""One registry repository, reached through the oras client (OCI Registry As Storage).

What mono-jit adds around oras' ``Registry``, and why:
- one try per request, with a timeout on every one: oras retries any failure five times with
  sleeps of 3 to 83 s and requests waits forever by default, so a registry that is down or
  stalled would hold a serving start-up for minutes; mono-jit compiles instead (or, offline,
  says so) after one bounded try;
- reads capped at what the manifest declares and hashed as they arrive: a blob that runs long,
  comes short or hashes to anything but its digest is refused before anyone parses it;
- credentials looked up the way registry tools look them up (docker's config file, also under
  ``$DOCKER_CONFIG`` or ``$REGISTRY_AUTH_FILE``, and ``ORAS_USER`` / ``ORAS_PASS``), held in
  memory for this process only, never written anywhere;
- every failure as one line (RemoteError; RemoteUnavailable when the registry is down, slow or
  answers 5xx, so a caller stops asking it for the rest of a run).

Importing this module imports oras and requests (about 0.2 s): only a miss or a push / pull
command does.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import oras.provider
import requests
import requests.adapters

from mono_jit.errors import RemoteError, RemoteUnavailable

from .reference import Reference

MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
MANIFEST_CAP = 4 << 20  # the distribution registry's own limit on a manifest
CHUNK = 1 << 16
MIN_RATE = 1 << 20  # bytes / s a blob must keep up once its first byte is in (beyond 3 timeouts)
AUTH_ADVICE = "log in with `docker login` (or set DOCKER_CONFIG, REGISTRY_AUTH_FILE, or ORAS_USER and ORAS_PASS)"

# oras wraps do_request in a retry decorator (functools.wraps keeps the plain function here).
_ONE_TRY = getattr(oras.provider.Registry.do_request, "__wrapped__", oras.provider.Registry.do_request)


class _TimeoutAdapter(requests.adapters.HTTPAdapter):
    """Sends every request with a timeout (oras passes none, requests has no session default)."""

    def __init__(self, timeout: float) -> None:
        super().__init__(max_retries=0)
        self._timeout = timeout

    def send(self, request, stream=False, timeout=None, **kwargs):  # type: ignore[no-untyped-def, override]
        return super().send(request, stream=stream, timeout=self._timeout if timeout is None else timeout, **kwargs)


class _Oras(oras.provider.Registry):
    """oras' Registry with one try per request, counting what it sends."""

    sent = 0

    def do_request(self, url, method="GET", data=None, headers=None, json=None, stream=False):  # type: ignore[no-untyped-def, override]
        self.sent += 1
        return _ONE_TRY(self, url, method, data, headers, json, stream)


def _errno_text(exc: BaseException) -> str:
    """The system's (or TLS's) reason inside a requests error ("Connection refused", "wrong
    version number"), else its type."""
    found = re.search(r"\[Errno -?\d+\] ([^'\")]+)", str(exc)) or re.search(r"\[SSL: [A-Z_]+\] ([^'\"(]+)", str(exc))
    return found.group(1).strip() if found else type(exc).__name__


class Registry:
    """The repository of `ref` on its registry: manifest and blob reads and writes."""

    def __init__(self, ref: Reference, *, insecure: bool = False, timeout: float = 10.0) -> None:
        self.ref, self.timeout = ref, timeout
        self._client = _Oras(hostname=ref.registry, insecure=insecure)
        adapter = _TimeoutAdapter(timeout)
        self._client.session.mount("https://", adapter)
        self._client.session.mount("http://", adapter)
        self._container = self._client.get_container(ref.name)
        self._base = f"{self._client.prefix}://"
        self._load_credentials()

    @property
    def requests_sent(self) -> int:
        return self._client.sent

    # -- reading -----------------------------------------------------------------------------

    def manifest(self) -> tuple[dict, bytes] | None:
        """The manifest `ref` names (parsed, and its exact bytes), or None if there is none."""
        url = self._base + self._container.manifest_url(self.ref.digest or self.ref.tag)
        with self._talking("read the manifest"):
            with self._client.do_request(url, "GET", headers={"Accept": MANIFEST_MEDIA_TYPE}, stream=True) as response:
                if response.status_code == 404:
                    return None
                self._check(response, "GET manifest")
                data = self._read(response, MANIFEST_CAP, None, "the manifest")
        if self.ref.digest is not None and "sha256:" + hashlib.sha256(data).hexdigest() != self.ref.digest:
            raise RemoteError(f"{self.ref}: the registry sent a manifest that does not hash to the pinned digest: refused")
        try:
            manifest = json.loads(data)
        except (ValueError, RecursionError) as exc:
            raise RemoteError(f"{self.ref}: the manifest is not JSON ({exc})") from None
        if not isinstance(manifest, dict):
            raise RemoteError(f"{self.ref}: the manifest is not a JSON object")
        return manifest, data

    def blob(self, digest: str, size: int) -> bytes:
        """The blob `digest`, exactly `size` bytes hashing to it; RemoteError otherwise."""
        url = self._base + self._container.get_blob_url(digest)
        what = f"blob {digest[7:19]}"
        with self._talking(f"fetch {what}"):
            with self._client.do_request(url, "GET", stream=True) as response:
                self._check(response, f"GET {what}")
                data = self._read(response, size, time.monotonic() + 3 * self.timeout + size / MIN_RATE, what)
        if len(data) != size:
            raise RemoteError(f"{self.ref}: {what} was cut off ({len(data)} of {size} bytes)")
        if "sha256:" + hashlib.sha256(data).hexdigest() != digest:
            raise RemoteError(f"{self.ref}: {what} does not hash to its digest (corrupt or forged): refused")
        return data

    def has_blob(self, digest: str) -> bool:
        url = self._base + self._container.get_blob_url(digest)
        with self._talking(f"look for blob {digest[7:19]}"):
            response = self._client.do_request(url, "HEAD")
        if response.status_code == 404:
            return False
        self._check(response, f"HEAD blob {digest[7:19]}")
        return True

    # -- writing -----------------------------------------------------------------------------

    def upload(self, data: bytes, digest: str, media_type: str) -> bool:
        """Upload a blob unless the registry has it; True when it was sent."""
        if self.has_blob(digest):
            return False
        layer = {"mediaType": media_type, "digest": digest, "size": len(data)}
        with tempfile.TemporaryDirectory(prefix="mono-jit-push-") as folder:
            path = Path(folder) / "blob"
            path.write_bytes(data)  # oras uploads from a file
            with self._talking(f"upload blob {digest[7:19]}"):
                response = self._client.put_upload(str(path), self._container, layer)
        self._check(response, f"PUT blob {digest[7:19]}")
        return True

    def put_manifest(self, manifest: dict) -> str:
        """Tag `manifest` as `ref` (its blobs must be uploaded); the registry's digest for it."""
        if self.ref.digest is not None:
            raise RemoteError(f"{self.ref}: cannot push to a digest; name a tag (REGISTRY/REPOSITORY:TAG)")
        with self._talking("upload the manifest"):
            response = self._client.upload_manifest(manifest, self._container)
        self._check(response, "PUT manifest")
        return response.headers.get("Docker-Content-Digest", "")

    # -- plumbing ----------------------------------------------------------------------------

    def _load_credentials(self) -> None:
        """Docker's config (and $DOCKER_CONFIG's, $REGISTRY_AUTH_FILE), then ORAS_USER / ORAS_PASS."""
        extra = [os.path.join(os.environ["DOCKER_CONFIG"], "config.json")] if os.environ.get("DOCKER_CONFIG") else []
        extra += [os.environ["REGISTRY_AUTH_FILE"]] if os.environ.get("REGISTRY_AUTH_FILE") else []
        configs = [p for p in extra if os.path.isfile(p)]
        try:
            self._client.auth.load_configs(self._container, configs=configs or None)
        except (OSError, ValueError) as exc:
            raise RemoteError(f"cannot read registry credentials ({', '.join(configs) or '~/.docker/config.json'}): "
                              f"{exc}") from None
        user, password = os.environ.get("ORAS_USER"), os.environ.get("ORAS_PASS")
        if user and password:
            self._client.auth.set_basic_auth(user, password)

    def _read(self, response: requests.Response, cap: int, deadline: float | None, what: str) -> bytes:
        """The body, refused past `cap` bytes or past `deadline` (a slow drip counts as down)."""
        chunks, total = [], 0
        for chunk in response.iter_content(CHUNK):
            total += len(chunk)
            if total > cap:
                raise RemoteError(f"{self.ref}: {what} runs past its {cap} bytes: refused")
            if deadline is not None and time.monotonic() > deadline:
                raise RemoteUnavailable(f"registry {self.ref.registry} is too slow sending {what}")
            chunks.append(chunk)
        return b"".join(chunks)

    def _check(self, response: requests.Response, what: str) -> None:
        code = response.status_code
        if 200 <= code < 300:
            return
        host = self.ref.registry
        if code in (401, 403):
            raise RemoteError(f"registry {host} refused {what} for {self.ref} ({code}): {AUTH_ADVICE}")
        if code >= 500:
            raise RemoteUnavailable(f"registry {host} answered {code} {response.reason} to {what} for {self.ref}")
        raise RemoteError(f"registry {host} answered {code} {response.reason} to {what} for {self.ref}")

    @contextmanager
    def _talking(self, doing: str) -> Iterator[None]:
        """requests' and oras' exceptions as one-line RemoteErrors naming the registry."""
        host = self.ref.registry
        try:
            yield
        except requests.exceptions.SSLError as exc:
            raise RemoteError(f"TLS with registry {host} failed ({_errno_text(exc)}); a plain-HTTP registry must be "
                              "named in MONO_JIT_REMOTE_INSECURE (or given --insecure)") from None
        except requests.exceptions.Timeout:
            raise RemoteUnavailable(f"registry {host} did not answer within {self.timeout:g} s "
                                    f"(trying to {doing} of {self.ref})") from None
        except (requests.exceptions.ChunkedEncodingError, requests.exceptions.ContentDecodingError) as exc:
            raise RemoteError(f"registry {host} cut off its answer (trying to {doing} of {self.ref}): "
                              f"{_errno_text(exc)}") from None
        except requests.exceptions.ConnectionError as exc:
            raise RemoteUnavailable(f"cannot reach registry {host} ({_errno_text(exc)}; trying to {doing} "
                                    f"of {self.ref})") from None
        except requests.exceptions.RequestException as exc:
            raise RemoteError(f"registry {host}: {type(exc).__name__} trying to {doing} of {self.ref}") from None
        except ValueError as exc:  # oras: an authentication it cannot answer, an upload with no session
            raise RemoteError(f"registry {host} (trying to {doing} of {self.ref}): {str(exc)[:200]}; "
                              f"{AUTH_ADVICE}") from None
