"""The cache past one host: entries as OCI artifacts in a container registry, through oras.

- reference.py: OCI references and the insecure-registry list, parsed without any client;
- artifact.py: one deterministic blob per entry, the manifest that lists them, and the checks
  a pulled blob passes (those of a local load);
- client.py: the registry through oras' Registry (one bounded try per request, capped and
  hashed reads, credentials as registry tools read them);
- transfer.py: `mono-jit push` / `mono-jit pull`;
- tier.py: the read-through tier resolve asks on a miss (MONO_JIT_REMOTE).

Importing this package imports neither oras nor requests.
"""

from .reference import Reference, parse_reference

__all__ = ["Reference", "parse_reference"]
