"""The few HIP runtime calls the runner needs, as ctypes over the `libamdhip64` torch has mapped.

Why ctypes and not hip-python: fifteen functions, no dependency, and above all the same copy
of the runtime torch uses. A second copy of libamdhip64 keeps separate device state (modules
and streams of one are invalid in the other), and loading it before torch can abort. So the
library is the copy already mapped into the process (found in /proc/self/maps, opened with
RTLD_NOLOAD), as AITER's IPC helpers (`quick_allreduce_ipc._load_hip`) and Triton's AMD driver
(`driver.c` initSymbolTable, RTLD_NOLOAD first) do.

Facts used here, each from HIP's headers (`hip_runtime_api.h`, `driver_types.h`) and clr:
- `hipModuleLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra)`; `extra` is
  `[HIP_LAUNCH_PARAM_BUFFER_POINTER=1, buf, HIP_LAUNCH_PARAM_BUFFER_SIZE=2, &size, END=3]`
  (CUDA's END is 0, HIP's is 3). clr copies the explicit arguments from `buf` at the offsets
  the code object states and writes every `hidden_*` argument itself.
- A module belongs to the calling thread's current device; the launch stream must be of that
  device. The image is registered without a copy, so its bytes live as long as the module.
- Device attributes: MultiprocessorCount = 63 (the cooperative CU count, reduced by CU masks
  and partition modes), PhysicalMultiProcessorCount = 10015.

Every failing call raises :class:`HipError` with HIP's own error string.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import MonoJitError

HIP_LAUNCH_PARAM_BUFFER_POINTER = 1
HIP_LAUNCH_PARAM_BUFFER_SIZE = 2
HIP_LAUNCH_PARAM_END = 3
ATTR_MULTIPROCESSOR_COUNT = 63
ATTR_PHYSICAL_MULTIPROCESSOR_COUNT = 10015
IPC_HANDLE_BYTES = 64
IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 0x1
MALLOC_UNCACHED = 0x3  # hipDeviceMallocUncached: fine-grained, never cached (peer memory)
MEMCPY_HOST_TO_DEVICE = 1
_LIBRARY_NAMES = ("libamdhip64.so", "libamdhip64.so.7", "libamdhip64.so.6")


class HipError(MonoJitError):
    """A HIP runtime call failed (its error code and HIP's string), or there is no HIP runtime."""


class IpcHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_ubyte * IPC_HANDLE_BYTES)]


def mapped_library() -> str | None:
    """The path of the libamdhip64 already mapped into this process (torch's), or None."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    for line in maps.splitlines():
        path = line.rsplit(" ", 1)[-1]
        if "/libamdhip64.so" in path:
            return path
    return None


def _open_library() -> ctypes.CDLL:
    """torch's copy of the runtime; a fresh load only when no copy is mapped (no torch ROCm)."""
    path = mapped_library()
    candidates = [path] if path else list(_LIBRARY_NAMES)
    errors = []
    for name in candidates:
        try:
            return ctypes.CDLL(name, mode=(os.RTLD_NOLOAD | os.RTLD_GLOBAL) if path else os.RTLD_GLOBAL)
        except OSError as exc:
            errors.append(str(exc))
    raise HipError(f"no HIP runtime (libamdhip64) can be loaded: {'; '.join(errors)}")


def _signatures(lib: ctypes.CDLL) -> None:
    vp, i, u, sz = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint, ctypes.c_size_t
    table = {
        "hipGetErrorString": ([i], ctypes.c_char_p),
        "hipGetDevice": ([ctypes.POINTER(i)], i),
        "hipDeviceGetAttribute": ([ctypes.POINTER(i), i, i], i),
        "hipModuleLoadData": ([ctypes.POINTER(vp), vp], i),
        "hipModuleGetFunction": ([ctypes.POINTER(vp), vp, ctypes.c_char_p], i),
        "hipModuleLaunchKernel": ([vp, u, u, u, u, u, u, u, vp, ctypes.POINTER(vp), ctypes.POINTER(vp)], i),
        "hipExtMallocWithFlags": ([ctypes.POINTER(vp), sz, u], i),
        "hipFree": ([vp], i),
        "hipMemset": ([vp, i, sz], i),
        "hipDeviceSynchronize": ([], i),
        "hipIpcGetMemHandle": ([ctypes.POINTER(IpcHandle), vp], i),
        "hipIpcOpenMemHandle": ([ctypes.POINTER(vp), IpcHandle, u], i),
        "hipIpcCloseMemHandle": ([vp], i),
    }
    for name, (args, result) in table.items():
        function = getattr(lib, name)
        function.argtypes, function.restype = args, result


@dataclass(frozen=True)
class Function:
    """A kernel of a loaded module: the handle, and the module and bytes it must outlive."""

    handle: int
    module: int
    name: str
    image: bytes = field(repr=False)  # HIP registers the image without copying it


class Hip:
    """The HIP calls, bound once per process (see the module docstring)."""

    _instance: "Hip | None" = None

    def __init__(self, lib: ctypes.CDLL) -> None:
        _signatures(lib)
        self._lib = lib

    @classmethod
    def get(cls) -> "Hip":
        if cls._instance is None:
            cls._instance = cls(_open_library())
        return cls._instance

    def _check(self, status: int, call: str) -> None:
        if status != 0:
            text = self._lib.hipGetErrorString(status)
            raise HipError(f"{call} failed: HIP error {status} ({text.decode() if text else 'unknown'})")

    def current_device(self) -> int:
        device = ctypes.c_int()
        self._check(self._lib.hipGetDevice(ctypes.byref(device)), "hipGetDevice")
        return device.value

    def attribute(self, attribute: int, device: int) -> int:
        value = ctypes.c_int()
        self._check(self._lib.hipDeviceGetAttribute(ctypes.byref(value), attribute, device),
                    f"hipDeviceGetAttribute({attribute}, device {device})")
        return value.value

    def compute_units(self, device: int) -> int:
        """CUs a launch can use on `device` (fewer under CPX / DPX partitions or CU masks)."""
        return self.attribute(ATTR_MULTIPROCESSOR_COUNT, device)

    def load(self, image: bytes, kernel: str) -> Function:
        """Load a code object on the current device and look its kernel up."""
        module, function = ctypes.c_void_p(), ctypes.c_void_p()
        self._check(self._lib.hipModuleLoadData(ctypes.byref(module), image), "hipModuleLoadData")
        self._check(self._lib.hipModuleGetFunction(ctypes.byref(function), module, kernel.encode()),
                    f"hipModuleGetFunction({kernel!r})")
        return Function(_address(function, "hipModuleGetFunction"), _address(module, "hipModuleLoadData"), kernel,
                        image)

    def launch(self, function: Function, grid: tuple[int, int, int], block: tuple[int, int, int],
               dynamic_lds: int, stream: int, kernargs: bytes) -> None:
        """Launch with the kernarg buffer passed through `extra` (explicit arguments only)."""
        buffer = ctypes.create_string_buffer(kernargs, len(kernargs))
        size = ctypes.c_size_t(len(kernargs))
        extra = (ctypes.c_void_p * 5)(HIP_LAUNCH_PARAM_BUFFER_POINTER, ctypes.cast(buffer, ctypes.c_void_p),
                                      HIP_LAUNCH_PARAM_BUFFER_SIZE, ctypes.cast(ctypes.byref(size), ctypes.c_void_p),
                                      HIP_LAUNCH_PARAM_END)
        self._check(self._lib.hipModuleLaunchKernel(function.handle, *grid, *block, dynamic_lds, stream, None, extra),
                    f"hipModuleLaunchKernel({function.name})")

    def malloc_uncached(self, nbytes: int) -> int:
        pointer = ctypes.c_void_p()
        self._check(self._lib.hipExtMallocWithFlags(ctypes.byref(pointer), nbytes, MALLOC_UNCACHED),
                    f"hipExtMallocWithFlags({nbytes}, uncached)")
        self._check(self._lib.hipMemset(pointer, 0, nbytes), "hipMemset")
        self._check(self._lib.hipDeviceSynchronize(), "hipDeviceSynchronize")
        return _address(pointer, "hipExtMallocWithFlags")

    def free(self, pointer: int) -> None:
        self._check(self._lib.hipFree(ctypes.c_void_p(pointer)), "hipFree")

    def ipc_handle(self, pointer: int) -> bytes:
        handle = IpcHandle()
        self._check(self._lib.hipIpcGetMemHandle(ctypes.byref(handle), ctypes.c_void_p(pointer)), "hipIpcGetMemHandle")
        return bytes(handle.reserved)

    def ipc_open(self, handle: bytes) -> int:
        if len(handle) != IPC_HANDLE_BYTES:
            raise HipError(f"an IPC handle of {len(handle)} bytes: expected {IPC_HANDLE_BYTES}")
        pointer = ctypes.c_void_p()
        self._check(self._lib.hipIpcOpenMemHandle(ctypes.byref(pointer), IpcHandle.from_buffer_copy(handle),
                                                  IPC_MEM_LAZY_ENABLE_PEER_ACCESS), "hipIpcOpenMemHandle")
        return _address(pointer, "hipIpcOpenMemHandle")

    def ipc_close(self, pointer: int) -> None:
        self._check(self._lib.hipIpcCloseMemHandle(ctypes.c_void_p(pointer)), "hipIpcCloseMemHandle")


def _address(pointer: ctypes.c_void_p, call: str) -> int:
    """The address a successful HIP call wrote; HipError if it left a null one."""
    if pointer.value is None:
        raise HipError(f"{call} succeeded but returned a null pointer")
    return pointer.value
