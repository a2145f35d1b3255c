"""K2's buffers and comparison for one rank: the package's (mono_jit/selfcheck/k2_run.py, which
`mono-jit selftest` uses too), under the name the tests import it by."""

from mono_jit.selfcheck.k2_run import H, PEER_WAIT_US, SENTINEL, K2Run  # noqa: F401
