"""The process state that makes a compile's bytes depend on its inputs only.

FlyDSL's embedded LLVM orders some operands by where its objects sit in memory. K2 at 64 rows,
ratio 128 compiled to one of four code objects in fresh processes (an ``add``'s operand order,
then register choice and schedule), while the LLVM IR FlyDSL hands to ``gpu-module-to-binary``
was identical each time, use-list orders included: the IR leaving LLVM's -O2 middle end already
differs. That LLVM is inside FlyDSL's wheel, so the order cannot be fixed where it is made;
instead a compile worker makes the memory layout a function of the job alone: no address-space
randomisation (`without_aslr`), one ``PYTHONHASHSEED`` (set and dict order decide the Python
allocations between LLVM's), every job in a fresh fork of a worker that has loaded the compiler
and compiled nothing (pipeline/workers.py), so what ran before cannot move the heap, and each
job on a new thread (`in_own_arena`), so neither can what the caller's interpreter allocated
(its script folder's listing on ``sys.path`` did, before).
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from typing import Any, Callable

# <linux/personality.h>: the persona flag that turns off address-space randomisation for the
# process and what it executes (what `setarch -R` sets).
ADDR_NO_RANDOMIZE = 0x0040000
QUERY_PERSONALITY = 0xFFFFFFFF
HASH_SEED = "0"


def seeded(env: dict[str, str]) -> dict[str, str]:
    """`env` with the one hash seed every compile worker starts with."""
    return {**env, "PYTHONHASHSEED": HASH_SEED}


def without_aslr(argv: list[str]) -> None:
    """Re-execute this interpreter with `argv` and address-space randomisation off, unless it
    is off already. Returns (randomised, as before) where the system refuses the persona: not
    Linux, or a seccomp filter, e.g. a container runtime's default profile, that allows only
    a few personality values."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    current = libc.personality(QUERY_PERSONALITY)
    if current == -1 or current & ADDR_NO_RANDOMIZE:
        return
    if libc.personality(current | ADDR_NO_RANDOMIZE) == -1:
        return
    os.execv(sys.executable, [sys.executable, *argv])



def in_own_arena(function: Callable[..., Any], *args: Any) -> Any:
    """``function(*args)`` on a new thread, its result or its exception. glibc gives a thread
    its own malloc arena at its first allocation, a new heap aligned to its 64 MiB maximum size
    (glibc malloc/arena.c: arena_get2, new_heap, HEAP_MAX_SIZE), so in a fresh fork every block
    the job allocates lands at the same offset whatever the main arena held: LLVM's pointer
    hashes (bits 4 to 25 for tables below 2^17 buckets) and address orders repeat."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = function(*args)
        except BaseException as exc:  # re-raised on the caller's thread below
            outcome["error"] = exc

    thread = threading.Thread(target=run, name="mono-jit-job")
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
