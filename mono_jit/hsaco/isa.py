"""Disassembly of a code object with the LLVM that links it, for gates on the instructions a
kernel relies on (scaled MFMA, agent-scope cache maintenance, no scratch traffic)."""

from __future__ import annotations

import collections
import subprocess
import tempfile
from pathlib import Path

from ..config import Settings
from ..errors import ToolchainError
from ..pipeline.toolchain import find_linker


def find_objdump(settings: Settings) -> Path:
    """llvm-objdump from the LLVM that holds the linker (one install, one gfx950 support level)."""
    linker = find_linker(settings)
    objdump = linker.path.resolve().parent / "llvm-objdump"
    if not objdump.is_file():
        raise ToolchainError(
            f"no llvm-objdump next to {linker.path.resolve()} (LLD {linker.version}); "
            "on Debian 12: apt-get install llvm-22"
        )
    return objdump


def disassemble(hsaco: bytes, objdump: Path, mcpu: str = "gfx950", window: tuple[int, int] | None = None) -> str:
    """The code object's llvm-objdump listing; `window` (start, stop) limits it to those addresses."""
    limits = [f"--start-address={window[0]:#x}", f"--stop-address={window[1]:#x}"] if window else []
    with tempfile.NamedTemporaryFile(suffix=".hsaco") as handle:
        handle.write(hsaco)
        handle.flush()
        out = subprocess.run([str(objdump), "-d", f"--mcpu={mcpu}", *limits, handle.name],
                             capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise ToolchainError(f"{objdump} could not disassemble the code object: {out.stderr.strip()[:300]}")
    return out.stdout


def instruction_counts(listing: str) -> collections.Counter[str]:
    """How often each mnemonic occurs in an llvm-objdump listing (instruction lines are tab-indented)."""
    counts: collections.Counter[str] = collections.Counter()
    for line in listing.splitlines():
        if line.startswith("\t") and line.strip():
            counts[line.split()[0]] += 1
    return counts
