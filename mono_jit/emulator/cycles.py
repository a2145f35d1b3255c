"""The CPU's cycle counter read from numba code, for the interpreter's profile (`profile.py`).

numba's nopython mode has no clock; LLVM's `llvm.readcyclecounter` intrinsic reads the
processor's time-stamp counter (`rdtsc` on x86-64) in a few cycles, so each instruction's cost
can be measured in the compiled loop itself."""

from __future__ import annotations

from typing import Any

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic


@intrinsic
def cycles(typingctx: Any) -> Any:
    """The time-stamp counter now (int64; only differences mean anything)."""
    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        function = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.IntType(64), []),
                                                  "llvm.readcyclecounter")
        return builder.call(function, [])
    return types.int64(), codegen
