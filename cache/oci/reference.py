"""OCI references (``registry.example/team/mono-jit:dsv4-pro-tp8``) parsed without any client.

The registry must be named explicitly (a host with a dot or a port): a bare ``team/cache`` would
silently mean Docker Hub to registry tools, which is never where a kernel cache should go by
accident. A reference may pin a manifest digest (``...@sha256:HEX``): a pull then refuses any
manifest whose bytes do not hash to it, as ``mono-jit import --sha256`` pins a bundle.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_HOST = re.compile(r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*"
                   r"(?::[0-9]{1,5})?|\[[0-9A-Fa-f:]+\](?::[0-9]{1,5})?")
_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
EXAMPLE = "registry.example/team/mono-jit:dsv4-pro-tp8"
DEFAULT_TAG = "latest"


@dataclass(frozen=True)
class Reference:
    """A parsed reference: registry host[:port], repository path, tag, optional manifest digest."""

    registry: str
    repository: str
    tag: str
    digest: str | None = None

    def __str__(self) -> str:
        return f"{self.registry}/{self.repository}" + (f"@{self.digest}" if self.digest else f":{self.tag}")

    @property
    def name(self) -> str:
        """registry/repository:tag, the form the oras client parses (the tag, never the digest)."""
        return f"{self.registry}/{self.repository}:{self.tag}"


def parse_reference(text: str) -> Reference:
    """`text` as a Reference; ValueError saying what was expected."""
    expected = f"expected an OCI reference REGISTRY/REPOSITORY[:TAG][@sha256:DIGEST], e.g. {EXAMPLE}"
    text = text.strip()
    digest = None
    if "@" in text:
        text, digest = text.split("@", 1)
        if not _DIGEST.fullmatch(digest):
            raise ValueError(f"digest {digest!r} is not sha256:<64 lowercase hex>; {expected}")
    registry, slash, rest = text.partition("/")
    if not slash or not rest:
        raise ValueError(f"{text!r} names no repository; {expected}")
    if not _HOST.fullmatch(registry) or not ("." in registry or ":" in registry):
        raise ValueError(f"{registry!r} is not a registry host (it needs a dot or a port, e.g. localhost:5000); "
                         f"{expected}")
    repository, tag = rest, DEFAULT_TAG
    last = rest.rsplit("/", 1)[-1]
    if ":" in last:
        repository, tag = rest.rsplit(":", 1)
        if not _TAG.fullmatch(tag):
            raise ValueError(f"tag {tag!r} is not a valid tag (letters, digits, '_', '.', '-'; up to 128); {expected}")
    for part in repository.split("/"):
        if not _COMPONENT.fullmatch(part):
            raise ValueError(f"repository part {part!r} is not lowercase letters and digits joined by '.', '_' "
                             f"or '-'; {expected}")
    return Reference(registry, repository, tag, digest)


def insecure_hosts(text: str) -> tuple[str, ...]:
    """MONO_JIT_REMOTE_INSECURE: comma-separated registry hosts (host[:port]) reached over plain HTTP."""
    hosts = tuple(h.strip() for h in text.split(",") if h.strip())
    for host in hosts:
        if not _HOST.fullmatch(host):
            raise ValueError(f"{host!r} is not a registry host[:port]")
    return hosts
