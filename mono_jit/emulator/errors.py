"""The emulator's errors: one base, itself a MonoJitError, that the launch checks report with
the error's kind (a fault, a hang, a code object or instruction it cannot run) since each
means the kernel did not run as the device would. Kept apart from the machine so that
catching them needs neither numba nor tinygrad."""

from __future__ import annotations

from ..errors import MonoJitError


class EmulatorError(MonoJitError):
    """The emulator could not run a launch as the device would."""
