"""The read-through registry tier (MONO_JIT_REMOTE): below the local layers, above compiling.

On a miss, resolve asks the tier while it holds the key's single-flight lock, so of eight ranks
missing the same key one fetches and the others find the published entry when the lock is
theirs. The manifest is read once per resolve session (one request) and each missing entry's
blob once (one request), verified, then published in the writable layer.

Faults never fail a resolve: each is one warning line, then resolve compiles (or, offline,
raises its offline miss). A registry that is down, slow or answers a bad manifest is not asked
again for the rest of the session, so a grid of misses costs one timeout, not one per kernel.
With MONO_JIT_REMOTE_PUSH=1 an entry this host compiled is pushed (a failure is a warning: the
entry still serves from the local cache).

Nothing here imports oras until a miss needs the registry: a warm hit never loads it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mono_jit.errors import RemoteError, RemoteUnavailable

from ..store import Entry, Store
from .reference import Reference

if TYPE_CHECKING:
    from mono_jit.config import Settings

    from .artifact import Listing
    from .client import Registry

_UNREAD = object()


def _log():  # type: ignore[no-untyped-def]
    import logging  # not on the hit path

    return logging.getLogger(__name__)


class RemoteTier:
    """The registry reference of MONO_JIT_REMOTE, for one resolve session."""

    def __init__(self, settings: Settings) -> None:
        if settings.remote is None:
            raise ValueError("a remote tier needs MONO_JIT_REMOTE")
        self.ref: Reference = settings.remote
        self.push_allowed = bool(settings.remote_push)
        self.insecure = self.ref.registry in settings.remote_insecure
        self.timeout = float(settings.remote_timeout)
        self._registry: Registry | None = None
        self._listing: object = _UNREAD
        self.down: str | None = None  # why the registry is not asked again this session

    def registry(self) -> Registry:
        if self._registry is None:
            from .client import Registry  # imports oras: only when the registry is needed

            self._registry = Registry(self.ref, insecure=self.insecure, timeout=self.timeout)
        return self._registry

    def listing(self) -> Listing | None:
        """The manifest's entries (read once), None if the reference names nothing yet; raises
        RemoteError (and marks the tier down) when it cannot be had."""
        if self.down is not None:
            raise RemoteUnavailable(self.down)
        if self._listing is _UNREAD:
            from .transfer import listing

            try:
                self._listing = listing(self.registry())
            except RemoteError as exc:
                self.down = str(exc)
                raise
        return self._listing  # type: ignore[return-value]

    def fetch(self, store: Store, key: str, arch: str, label: str, then: str) -> Entry | None:
        """The registry's verified copy of `key`, published in `store`; None (after one warning
        line ending with `then`, what the caller does next) when it has none or a fault."""
        if self.down is not None:
            return None
        try:
            found = self.listing()
            listed = None if found is None else found.entries.get(key)
            if listed is None:
                _log().info("%s is not in %s; %s", label, self.ref, then)
                return None
            if listed.arch != arch:
                _log().warning("%s lists entry %s for arch %s, not %s: ignored; %s", self.ref, key[:16], listed.arch,
                             arch, then)
                return None
            from .transfer import fetch, publish

            hsaco, meta = fetch(self.registry(), listed)
            entry = publish(store, listed, hsaco, meta)
        except RemoteUnavailable as exc:
            self.down = str(exc)
            _log().warning("registry tier: %s; %s (the registry is not asked again in this run)", exc, then)
            return None
        except RemoteError as exc:
            _log().warning("registry tier: %s; %s", exc, then)
            return None
        _log().info("fetched %s (%s, %d bytes) from %s", label, key[:16], listed.size, self.ref)
        return entry

    def fingerprints(self, arch: str) -> list[dict]:
        """Toolchains the registry's entries of `arch` were built with (a host that cannot
        fingerprint its own computes keys from these); [] after one warning on a fault."""
        if self.down is not None:
            return []
        try:
            found = self.listing()
        except RemoteError as exc:
            _log().warning("registry tier: %s (the registry is not asked again in this run)", exc)
            return []
        return [] if found is None else found.fingerprints(arch)

    def lists(self, key: str) -> bool:
        """Whether the (already read) manifest lists `key`."""
        found = None if self.down is not None or self._listing is _UNREAD else self._listing
        return found is not None and key in found.entries  # type: ignore[attr-defined]

    def offer(self, entry: Entry, label: str) -> None:
        """Push an entry this host compiled, when MONO_JIT_REMOTE_PUSH allows (a warning on failure)."""
        if not self.push_allowed or self.down is not None:
            return
        from .transfer import push

        try:
            push(self.registry(), [entry])
        except RemoteError as exc:
            _log().warning("registry tier: could not push %s to %s: %s; it serves from the local cache", label,
                         self.ref, exc)
            return
        self._listing = _UNREAD  # the manifest changed
        _log().info("pushed %s (%s) to %s", label, entry.key[:16], self.ref)
