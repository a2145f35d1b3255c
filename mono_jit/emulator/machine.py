"""Emulated MI355X devices: host memory registered as device memory, launches of code objects
with every workgroup co-resident, and what a launch did (counters) or why it failed.

Device memory is host memory: a torch CPU tensor's (or numpy array's) `data_ptr()` is its device
address, so the kernargs the runtime packs (`runtime/kernargs.pack`) run unchanged. Every access
must fall inside a registered allocation; writes into one registered read-only (weights) fail.
Several devices share one memory (peer buffers are plain host memory), and a launch may span
several devices at once (`launch_many`), interleaved deterministically.
"""

from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np
from numba import typed

from . import interpreter, profile, state, weak, weak_state
from .clock import trace as clock_trace
from .codeobj import USER_SGPRS, CodeObject, CodeObjectError
from .decode import F_NEXT, F_TARGET
from .errors import EmulatorError
from .ops import CLASSES

LDS_BYTES = 160 * 1024  # gfx950's LDS per CU (MI355X: 160 KiB)
WAVE = 64
IDLE_WAIT_SECONDS = 30.0  # a launch polling another process's memory gives up after this long idle
TICKS_PER_SECOND = 100_000_000  # s_memrealtime's rate: the GFX9 family's fixed 100 MHz clock (as state.py)
POLL_BACKOFF_SECONDS = (0.001, 0.05)  # first and longest sleep between polls of another process's stores


class EmulatorFault(EmulatorError):
    """A launch failed as it would on the device (a trap, a bad address) or hung (Deadlock)."""


class Deadlock(EmulatorFault):
    """No wave of a launch can progress: every live wave waits at a barrier or on memory."""


@dataclass
class Allocation:
    name: str
    base: int
    size: int
    writable: bool
    weight: bool
    owner: Any  # keeps the tensor / array alive while registered
    view: np.ndarray  # uint8 view of the bytes


@dataclass(frozen=True)
class Launch:
    """One kernel launch on one device: the code object, its shape and its kernarg bytes."""

    code: CodeObject
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    kernarg: bytes
    dynamic_lds: int = 0
    device: int = 0


@dataclass
class LaunchReport:
    """What a launch did: per device counters and per allocation traffic."""

    kernels: list[str]
    seconds: float
    wave_instructions: int
    by_class: dict[str, int]
    mfma: int
    barriers: int
    polls: int
    idle_rounds: int
    scheduler_passes: int  # rounds over every wave: a launch's waiting chains
    lds_bytes_read: int
    lds_bytes_written: int
    bytes_read: int
    bytes_written: int
    per_device: list[dict[str, int]]
    per_allocation: dict[str, dict[str, int]] = field(default_factory=dict)
    busiest_workgroup_instructions: int = 0
    stale_reads: int = 0  # weak-memory mode, counting: the stale reads, and the first described
    stale_report: list[str] = field(default_factory=list)
    trace: clock_trace.Trace | None = None  # the clock's events when `Machine.timing` is set (clock/timing.py times them)

    @property
    def counters(self) -> dict[str, Any]:
        return {"wave_instructions": self.wave_instructions, "by_class": self.by_class, "mfma": self.mfma,
                "barriers": self.barriers, "polls": self.polls, "idle_rounds": self.idle_rounds,
                "scheduler_passes": self.scheduler_passes,
                "lds_bytes_read": self.lds_bytes_read, "lds_bytes_written": self.lds_bytes_written,
                "bytes_read": self.bytes_read, "bytes_written": self.bytes_written,
                "busiest_workgroup_instructions": self.busiest_workgroup_instructions,
                "per_device": self.per_device, "per_allocation": self.per_allocation}


def _bytes_of(obj: Any) -> tuple[int, int, np.ndarray]:
    """(address, size, uint8 view) of a torch tensor's or numpy array's memory."""
    if isinstance(obj, np.ndarray):
        if not obj.flags.c_contiguous:
            raise ValueError("a registered numpy array must be C-contiguous")
        return obj.ctypes.data, obj.nbytes, obj.reshape(-1).view(np.uint8)
    if hasattr(obj, "data_ptr") and hasattr(obj, "untyped_storage"):
        if obj.device.type != "cpu":
            raise ValueError(f"a registered tensor must live in host memory, not on {obj.device}")
        storage = obj.untyped_storage()
        address, size = storage.data_ptr(), storage.nbytes()
        if size == 0:
            return address, 0, np.zeros(0, np.uint8)
        view = np.frombuffer((ctypes.c_uint8 * size).from_address(address), np.uint8)
        return address, size, view
    raise TypeError(f"cannot register {type(obj).__name__}: expected a torch CPU tensor or a numpy array")


class Machine:
    """`devices` emulated gfx950 devices sharing host memory."""

    def __init__(self, devices: int = 1) -> None:
        if devices < 1:
            raise ValueError(f"devices={devices}: expected at least 1")
        self.devices = devices
        self.allocations: list[Allocation] = []
        self.external_writers = False  # another process writes registered memory (peer buffers)
        self.external_wait_seconds = IDLE_WAIT_SECONDS  # the longest such a launch waits with no progress
        self.weak_memory: weak_state.WeakMemory | None = None  # None: sequentially consistent memory
        self.timing: clock_trace.Clock | None = None  # set: launches record the clock's event trace
        self.uncached: set[int] = set()  # bases of the allocations mapped uncached (UC), as peer buffers

    def mark_uncached(self, obj: Any) -> None:
        """Tell the weak-memory mode that a registered buffer is mapped uncached (UC), as
        `runtime/hip.py` allocates the peer buffers: every access to it goes to memory."""
        self.uncached.add(_bytes_of(obj)[0])

    # -- memory -----------------------------------------------------------------------------------
    def register(self, obj: Any, name: str, writable: bool = True) -> int:
        """Make a tensor's (whole storage's) bytes device memory; returns the base address. A
        read-only registration is a weight: writes to it fault, and its distinct bytes read are
        counted. Registering memory that overlaps a registration merges the two."""
        address, size, view = _bytes_of(obj)
        if size == 0:
            return address
        new = Allocation(name, address, size, writable, not writable, obj, view)
        for old in [a for a in self.allocations if a.base < address + size and address < a.base + a.size]:
            self.allocations.remove(old)
            lo, hi = min(old.base, new.base), max(old.base + old.size, new.base + new.size)
            owner = old if old.base == lo and old.size == hi - lo else new if new.base == lo and new.size == hi - lo else None
            if owner is None:
                raise ValueError(f"{name!r} [{address:#x}, +{size}) straddles {old.name!r} [{old.base:#x}, +{old.size})")
            names = old.name if old.name == new.name else f"{owner.name}|{(new if owner is old else old).name}"
            new = Allocation(names, owner.base, owner.size, old.writable or new.writable, old.weight and new.weight,
                             owner.owner, owner.view)
        self.allocations.append(new)
        self.allocations.sort(key=lambda a: a.base)
        return address

    def register_new(self, obj: Any, name: str, writable: bool = True) -> bool:
        """Register `obj` unless its bytes are already registered; True if it was added."""
        address, size, _ = _bytes_of(obj)
        if any(a.base <= address and address + size <= a.base + a.size for a in self.allocations):
            return False
        self.register(obj, name, writable)
        return True

    def unregister(self, obj: Any) -> None:
        address, _, _ = _bytes_of(obj)
        self.allocations = [a for a in self.allocations if a.base != address]

    def nearest(self, address: int) -> str:
        """The allocation nearest an address, for fault reports."""
        if not self.allocations:
            return "no allocation is registered"
        best = min(self.allocations, key=lambda a: 0 if a.base <= address < a.base + a.size
                   else min(abs(address - a.base), abs(address - (a.base + a.size))))
        if best.base <= address < best.base + best.size:
            return f"inside {best.name!r} [{best.base:#x}, +{best.size}) at offset {address - best.base}"
        where = address - (best.base + best.size) if address >= best.base else best.base - address
        side = "past the end of" if address >= best.base else "before"
        return f"{where} bytes {side} {best.name!r} [{best.base:#x}, +{best.size})"

    # -- launches ---------------------------------------------------------------------------------
    def launch(self, code: CodeObject, grid: Sequence[int], block: Sequence[int], kernarg: bytes,
               dynamic_lds: int = 0, device: int = 0, budget: int = 1 << 40) -> LaunchReport:
        """Run one kernel to completion (see `launch_many`)."""
        return self.launch_many([Launch(code, _dims(grid), _dims(block), bytes(kernarg), dynamic_lds, device)], budget)

    def launch_many(self, launches: Iterable[Launch], budget: int = 1 << 40) -> LaunchReport:
        """Run launches on their devices together, every workgroup of each co-resident, to
        completion; raise EmulatorFault (or Deadlock) with the failing wave's state."""
        launches = list(launches)
        arrays = _State(self, launches)
        try:
            return self._run(arrays, budget)
        finally:
            arrays.release()

    def _run(self, arrays: "_State", budget: int) -> LaunchReport:
        start = time.perf_counter()
        idle_since = None
        while True:
            progress = int(arrays.ctl[state.C_STORES] + arrays.ctl[state.C_EVENTS])
            result = arrays.run(budget)
            if result != state.IDLE:
                break
            now = time.monotonic()
            if idle_since is None or arrays.ctl[state.C_STORES] + arrays.ctl[state.C_EVENTS] != progress:
                idle_since, pause = now, POLL_BACKOFF_SECONDS[0]
            if now - idle_since > self.external_wait_seconds:
                raise Deadlock(arrays.blocked_report(f"no progress for {self.external_wait_seconds:.0f} s"))
            time.sleep(pause)
            pause = min(2 * pause, POLL_BACKOFF_SECONDS[1])
            # the device's real-time clock runs on while it waits for the other process
            arrays.clock += round((time.monotonic() - now) * TICKS_PER_SECOND)
            arrays.ctl[state.C_EPOCH] += 1
        seconds = time.perf_counter() - start
        if result == state.FAULTED:
            raise EmulatorFault(arrays.fault_report())
        if result == state.DEADLOCKED:
            raise Deadlock(arrays.blocked_report("no wave can progress"))
        if result == state.BUDGET:
            raise EmulatorFault(arrays.blocked_report(f"more than {budget} wave-instructions"))
        return arrays.report(seconds)


def _dims(values: Sequence[int]) -> tuple[int, int, int]:
    dims = tuple(int(v) for v in values) + (1,) * (3 - len(values))
    if len(dims) != 3 or min(dims) < 1:
        raise ValueError(f"launch dimensions {tuple(values)}: expected 1 to 3 positive integers")
    return dims  # type: ignore[return-value]


class _State:
    """The arrays of one launch_many: waves, workgroups, memory, counters."""

    def __init__(self, machine: Machine, launches: list[Launch]) -> None:
        self.machine = machine
        self.launches = launches
        tables, self.row0 = [], []
        rows = 0
        for launch in launches:
            if not 0 <= launch.device < machine.devices:
                raise ValueError(f"device {launch.device}: the machine has devices 0..{machine.devices - 1}")
            table = launch.code.program.table.copy()
            table[:, F_NEXT] += rows  # each launch's rows follow the ones before in one table
            table[:, F_TARGET] += rows
            tables.append(table)
            self.row0.append(rows)
            rows += len(table)
        self.program = np.concatenate(tables)
        self.kernargs = []
        for index, launch in enumerate(launches):
            buffer = np.zeros(max(len(launch.kernarg), launch.code.descriptor.kernarg_size, 4) + 256, np.uint8)
            buffer[:len(launch.kernarg)] = np.frombuffer(launch.kernarg, np.uint8)
            machine.register(buffer, f"kernarg[{index}]", writable=False)
            self.kernargs.append(buffer)
        self.scratch = [self._private_segments(index, launch) for index, launch in enumerate(launches)]
        self._build_waves()
        self._build_memory()

    def _private_segments(self, index: int, launch: Launch) -> np.ndarray | None:
        """The launch's scratch: the private_segment_fixed_size of its kernel descriptor for
        every lane of every wave (zeroed; registered writable), or None when it asks for none."""
        private = launch.code.descriptor.private_segment_size
        if not private:
            return None
        if private % 4:
            raise CodeObjectError(f"{launch.code.name}: private segment of {private} bytes, not whole dwords")
        threads = launch.block[0] * launch.block[1] * launch.block[2]
        workgroups = launch.grid[0] * launch.grid[1] * launch.grid[2]
        buffer = np.zeros(workgroups * -(-threads // WAVE) * WAVE * private, np.uint8)
        self.machine.register(buffer, f"scratch[{index}]")
        return buffer

    def release(self) -> None:
        """Unregister the launch's kernarg and scratch buffers."""
        for buffer in self.kernargs + [b for b in self.scratch if b is not None]:
            self.machine.unregister(buffer)

    def _build_waves(self) -> None:
        waves: list[tuple[int, Launch, int, tuple[int, int, int], int, int]] = []
        ctas: list[tuple[int, int, int]] = []
        lds_sizes: list[int] = []
        vgprs = max(launch.code.descriptor.vgprs for launch in self.launches)
        for index, launch in enumerate(self.launches):
            kd = launch.code.descriptor
            lds = kd.group_segment_size + launch.dynamic_lds
            if lds > LDS_BYTES:
                raise CodeObjectError(f"{launch.code.name}: {lds} bytes of LDS a workgroup, past gfx950's {LDS_BYTES}")
            threads = launch.block[0] * launch.block[1] * launch.block[2]
            if threads > 1024:
                raise CodeObjectError(f"{launch.code.name}: {threads} work-items a workgroup (at most 1024)")
            gx, gy, gz = launch.grid
            for z in range(gz):
                for y in range(gy):
                    for x in range(gx):
                        cta = len(ctas)
                        n_waves = -(-threads // WAVE)
                        ctas.append((n_waves, len(waves), lds))
                        for wave in range(n_waves):
                            waves.append((index, launch, cta, (x, y, z), wave, threads))
                        lds_sizes.append(lds)
        W = len(waves)
        self.S = np.zeros((W, 136), np.uint32)
        self.V = np.zeros((W, vgprs, WAVE), np.uint32)
        self.WS = np.zeros((W, state.WS_FIELDS), np.int64)
        self.CTA = np.zeros((len(ctas), 4), np.int64)
        self.LDS = np.zeros((len(ctas), max(lds_sizes) if lds_sizes else 4), np.uint8)
        for c, (n_waves, first, lds) in enumerate(ctas):
            self.CTA[c] = (n_waves, 0, first, lds)
        self.wave_info = []
        first_wave: dict[int, int] = {}
        for w, (index, launch, cta, (x, y, z), wave, threads) in enumerate(waves):
            kd = launch.code.descriptor
            scratch = self.scratch[index]
            if scratch is not None:  # the wave's block of its launch's scratch
                k = w - first_wave.setdefault(index, w)
                self.WS[w, state.WS_PRIVATE] = kd.private_segment_size
                self.WS[w, state.WS_SCRATCH] = scratch.ctypes.data + k * WAVE * kd.private_segment_size
            self.WS[w, state.WS_PC] = self.row0[index] + launch.code.program.entry
            self.WS[w, state.WS_CTA] = cta
            self.WS[w, state.WS_DEVICE] = launch.device
            self.WS[w, state.WS_ROW0] = self.row0[index]
            sgpr = 0
            for name in kd.user_sgprs:  # user SGPRs in the hardware's order
                if name == "kernarg_segment_ptr":
                    address = self.kernargs[index].ctypes.data
                    self.S[w, sgpr], self.S[w, sgpr + 1] = address & 0xFFFFFFFF, address >> 32
                else:
                    raise CodeObjectError(f"{launch.code.name}: user SGPR {name} is not emulated")
                sgpr += dict(USER_SGPRS)[name]
            if sgpr != kd.user_sgpr_count:
                raise CodeObjectError(f"{launch.code.name}: {kd.user_sgpr_count} user SGPRs declared, {sgpr} known")
            for enabled, value in zip(kd.workgroup_ids, (x, y, z)):
                if enabled:
                    self.S[w, sgpr] = value
                    sgpr += 1
            lanes = min(WAVE, threads - wave * WAVE)
            mask = (1 << lanes) - 1
            self.S[w, state.EXEC], self.S[w, state.EXEC + 1] = mask & 0xFFFFFFFF, mask >> 32
            bx, by, _ = launch.block
            for lane in range(lanes):  # packed work-item ids: x bits 0-9, y 10-19, z 20-29
                t = wave * WAVE + lane
                self.V[w, 0, lane] = t % bx | (t // bx % by) << 10 | (t // (bx * by)) << 20
            self.wave_info.append((index, cta, (x, y, z), wave))

    def _build_memory(self) -> None:
        allocations = self.machine.allocations
        self.ALLOC = np.zeros((max(len(allocations), 1), 4), np.int64)
        self.ALLOC[:, 0] = -1  # a dummy row when nothing is registered never matches
        self.BUFS = typed.List()
        self.TOUCH = typed.List()
        for k, a in enumerate(allocations):
            self.ALLOC[k] = (a.base, a.size, (1 if a.writable else 0) | (2 if a.weight else 0), 0)
            self.BUFS.append(a.view)
            self.TOUCH.append(np.zeros(-(-a.size // 4) if a.weight else 1, np.uint8))
        if not allocations:
            self.BUFS.append(np.zeros(1, np.uint8))
            self.TOUCH.append(np.zeros(1, np.uint8))
        self.ABYTES = np.zeros((self.ALLOC.shape[0], 6), np.int64)
        self.CNT = np.zeros((self.machine.devices, state.CNT_FIELDS), np.int64)
        self.ctl = np.zeros(state.CTL_FIELDS, np.int64)
        self.clock = np.zeros(self.machine.devices, np.int64)
        self.T = np.zeros((8, WAVE), np.uint32)
        options = self.machine.weak_memory
        if options is None:
            self.W = weak_state.off_state(self.WS.shape[0])
        else:
            self.W = weak_state.build(options, allocations, self.machine.uncached, self.WS[:, state.WS_CTA],
                                      self.WS[:, state.WS_DEVICE], self.machine.devices)
        timing = self.machine.timing
        if timing is None:
            self.TR = clock_trace.off_state()
        else:  # bit 8 d + x: workgroup c of device d on XCD c mod 8 (round-robin dispatch)
            bits = 8 * self.WS[:, state.WS_DEVICE] + self.WS[:, state.WS_CTA] % clock_trace.XCDS
            self.TR = clock_trace.build(timing, [a.size for a in allocations], [a.writable for a in allocations],
                                        self.WS.shape[0], bits.astype(np.int64))

    def run(self, budget: int) -> int:
        table = profile.active_table()
        started = profile.now() if table.shape[1] else 0
        result = int(interpreter.run(self.program, self.S, self.V, self.WS, self.CTA, self.LDS, self.ALLOC, self.BUFS,
                                     self.TOUCH, self.ABYTES, self.CNT, self.ctl, self.clock, self.T, budget,
                                     self.machine.external_writers, self.W, self.TR, table))
        if table.shape[1]:
            table[profile.CYCLES, profile.TOTAL] += profile.now() - started
        return result

    # -- reports --------------------------------------------------------------------------------
    def _instruction(self, w: int, row: int) -> str:
        index = self.wave_info[w][0]
        program = self.launches[index].code.program
        r = row - self.row0[index]
        return f"pc {program.addresses[r]:#x} ({program.names[r]})" if 0 <= r < len(program.names) else f"row {row}"

    def _who(self, w: int) -> str:
        index, cta, (x, y, z), wave = self.wave_info[w]
        return f"workgroup ({x}, {y}, {z}) wave {wave} of {self.launches[index].code.name}"

    def stale_reports(self) -> list[str]:
        """The weak-memory mode's recorded stale reads, one paragraph each."""
        count = min(int(self.W[0][weak.O_COUNT]), weak.REPORTS)
        names = [a.name for a in self.machine.allocations]
        return [weak_state.describe(self.W[weak.W_REP][n], self._who, self._instruction, names.__getitem__)
                for n in range(count)]

    def _where(self, w: int) -> tuple[str, str]:
        index, cta, (x, y, z), wave = self.wave_info[w]
        launch = self.launches[index]
        row = int(self.WS[w, state.WS_PC]) - self.row0[index]
        program = launch.code.program
        pc = program.addresses[row] if 0 <= row < len(program.addresses) else -1
        name = program.names[row] if 0 <= row < len(program.names) else "?"
        return (f"{launch.code.name} on device {launch.device}, workgroup ({x}, {y}, {z}) wave {wave}",
                f"pc {pc:#x} ({name})")

    def fault_report(self) -> str:
        ctl = self.ctl
        w = int(ctl[state.C_WAVE])
        self.WS[w, state.WS_PC] = ctl[state.C_ROW]
        where, pc = self._where(w)
        kind, lane, address, size, detail = (int(ctl[state.C_FAULT]), int(ctl[state.C_LANE]), int(ctl[state.C_ADDRESS]),
                                             int(ctl[state.C_SIZE]), int(ctl[state.C_DETAIL]))
        at = f"{where}, {pc}" + (f", lane {lane}" if lane >= 0 else "")
        if kind == state.FAULT_TRAP:
            return f"s_trap {detail} (the kernel aborted the launch, as HIP reports a trap): {at}"
        if kind == state.FAULT_UNMAPPED:
            return (f"memory access outside every allocation: {size} bytes at {address:#x}, "
                    f"{self.machine.nearest(address)}: {at}")
        if kind == state.FAULT_READ_ONLY:
            return f"write into read-only memory at {address:#x}, {self.machine.nearest(address)}: {at}"
        if kind == state.FAULT_UNALIGNED:
            return f"unaligned {size}-byte access at {address:#x} (LDS and atomics need dword alignment): {at}"
        if kind == state.FAULT_LDS:
            return f"LDS access of {size} bytes at {address:#x}, past the workgroup's {detail} bytes: {at}"
        if kind == state.FAULT_PRIVATE:
            return (f"scratch access of {size} bytes at private address {address:#x}, past the work-item's "
                    f"{detail}-byte private segment (the descriptor's private_segment_fixed_size): {at}")
        if kind == state.FAULT_STALE:
            return self.stale_reports()[0]
        if kind == state.FAULT_WEAK_FULL:
            options = self.machine.weak_memory
            lines = int(self.W[weak.W_OPT][weak.O_LINES]) * weak.LINE >= len(self.W[weak.W_MEM])
            budget = f"lines={options.lines if options else 0} lines of writable memory touched" if lines else \
                f"slots={options.slots if options else 0} lines held by its caches"
            return f"weak-memory mode: the launch needs more than {budget}; expected fewer (raise WeakMemory's): {at}"
        if kind == state.FAULT_EXEC:
            return f"MFMA with a partial EXEC mask ({address & (2**64 - 1):#018x}) is not modelled: {at}"
        return f"operand form not modelled (case {detail}, value {address:#x}): {at}"

    def blocked_report(self, why: str) -> str:
        lines = [f"launch stopped: {why}; blocked waves:"]
        names = {state.AT_BARRIER: "at s_barrier", state.PARKED: "polling", state.RUNNING: "running"}
        for w in range(len(self.wave_info)):
            status = int(self.WS[w, state.WS_STATUS])
            if status == state.DONE:
                continue
            where, pc = self._where(w)
            line = f"  {where}: {names.get(status, status)} at {pc}"
            if status != state.AT_BARRIER:
                address = int(self.WS[w, state.WS_POLL])
                line += f", last load {address:#x} = {self._peek(address)} ({self.machine.nearest(address)})"
            lines.append(line)
            if len(lines) > 64:
                lines.append(f"  ... and {sum(1 for k in range(w + 1, len(self.wave_info)) if self.WS[k, 1] != state.DONE)} more")
                break
        return "\n".join(lines)

    def _peek(self, address: int) -> str:
        for a in self.machine.allocations:
            if a.base <= address and address + 4 <= a.base + a.size:
                return f"{int(a.view[address - a.base:address - a.base + 4].view(np.uint32)[0]):#x}"
        return "unmapped"

    def report(self, seconds: float) -> LaunchReport:
        cnt = self.CNT
        n = len(CLASSES)
        per_device = []
        for d in range(self.machine.devices):
            row = {name: int(cnt[d, k]) for k, name in enumerate(CLASSES)}
            row["wave_instructions"] = int(cnt[d, :n].sum())
            per_device.append(row)
        per_allocation = {}
        for k, a in enumerate(self.machine.allocations):
            r = self.ABYTES[k]
            if not r.any():
                continue
            entry = {"buffer_read": int(r[0]), "buffer_written": int(r[1]), "global_read": int(r[2]),
                     "global_written": int(r[3]), "scalar_read": int(r[4])}
            if a.weight:
                entry["distinct_bytes_read"] = int(self.TOUCH[k].sum()) * 4
            per_allocation[a.name] = entry
        by_cta = np.zeros(self.CTA.shape[0], np.int64)
        np.add.at(by_cta, self.WS[:, state.WS_CTA], self.WS[:, state.WS_COUNT])
        return LaunchReport(
            kernels=[launch.code.name for launch in self.launches], seconds=seconds,
            wave_instructions=int(cnt[:, :n].sum()),
            by_class={name: int(cnt[:, k].sum()) for k, name in enumerate(CLASSES)},
            mfma=int(cnt[:, CLASSES.index("mfma")].sum()), barriers=int(cnt[:, state.CNT_BARRIERS].sum()),
            polls=int(cnt[:, state.CNT_POLLS].sum()), idle_rounds=int(cnt[:, state.CNT_IDLE].max()),
            scheduler_passes=int(self.ctl[state.C_PASSES]),
            lds_bytes_read=int(cnt[:, state.CNT_LDS_READ].sum()), lds_bytes_written=int(cnt[:, state.CNT_LDS_WRITTEN].sum()),
            bytes_read=int(cnt[:, state.CNT_READ].sum()), bytes_written=int(cnt[:, state.CNT_WRITTEN].sum()),
            per_device=per_device, per_allocation=per_allocation,
            busiest_workgroup_instructions=int(by_cta.max()) if len(by_cta) else 0,
            stale_reads=int(self.W[0][weak.O_COUNT]), stale_report=self.stale_reports(),
            trace=clock_trace.collect(self.TR, self.WS, self.CTA[:, 2]) if self.TR[0][clock_trace.R_ON] else None)
