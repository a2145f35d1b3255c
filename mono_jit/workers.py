"""Compile workers: spawned processes that each run many compile jobs, one at a time.

A crash or abort inside MLIR kills only its worker (the job fails, a fresh worker replaces it);
a job past its timeout has its worker killed. Workers are spawned, not forked, and start from a
given environment, so FlyDSL sees exactly the sanitised variables (toolchain.compile_environment).
"""

from __future__ import annotations

import multiprocessing
import os
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any, Callable, Iterable, Iterator

_SPAWN = multiprocessing.get_context("spawn")


@dataclass(frozen=True)
class Outcome:
    job_id: Any
    status: str  # "ok", "error", "timeout" or "crash"
    value: Any = None  # the result on "ok"; a message otherwise
    seconds: float = 0.0


def _serve(conn: Connection, env: dict[str, str], target: Callable[..., Any]) -> None:
    os.environ.clear()
    os.environ.update(env)
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message is None:
            return
        job_id, args = message
        try:
            conn.send((job_id, "ok", target(*args)))
        except BaseException as exc:  # report everything; the parent decides
            detail = str(exc) or type(exc).__name__
            conn.send((job_id, "error", f"{type(exc).__name__}: {detail}\n{traceback.format_exc(limit=6)}"))


class _Worker:
    def __init__(self, env: dict[str, str], target: Callable[..., Any]) -> None:
        self.conn, child = _SPAWN.Pipe()
        self.process = _SPAWN.Process(target=_serve, args=(child, env, target), daemon=True)
        self.process.start()
        child.close()
        self.job: Any = None
        self.started = 0.0

    def stop(self, kill: bool = False) -> None:
        if kill:
            self.process.kill()
        else:
            try:
                self.conn.send(None)
            except OSError:
                pass
        self.process.join(timeout=10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.conn.close()


class WorkerPool:
    """`size` workers calling `target(*args)` for each submitted job."""

    def __init__(self, size: int, env: dict[str, str], target: Callable[..., Any], timeout: float) -> None:
        if size < 1:
            raise ValueError(f"jobs={size}: expected at least 1 worker")
        self._env, self._target, self._timeout = env, target, timeout
        self._size = size
        self._workers: list[_Worker] = []

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc: object) -> None:
        for worker in self._workers:
            worker.stop(kill=worker.job is not None)
        self._workers.clear()

    def run(self, items: Iterable[tuple[Any, tuple]]) -> Iterator[Outcome]:
        """Run (job_id, args) items, pulling the iterable only when a worker is idle, and yield
        each outcome as it finishes. Lazy pulling lets a caller decide per item, at dispatch
        time, whether it still needs compiling (e.g. after taking the key's lock)."""
        pending = iter(items)
        exhausted = False
        while True:
            while not exhausted and self._busy() < self._size:
                item = next(pending, None)
                if item is None:
                    exhausted = True
                else:
                    self._submit(*item)
            if not self._busy():
                return
            yield from self._wait()

    def _busy(self) -> int:
        return sum(1 for w in self._workers if w.job is not None)

    def _submit(self, job_id: Any, args: tuple) -> None:
        worker = next((w for w in self._workers if w.job is None), None)
        if worker is None:
            worker = _Worker(self._env, self._target)
            self._workers.append(worker)
        worker.conn.send((job_id, args))
        worker.job, worker.started = job_id, time.monotonic()

    def _wait(self) -> list[Outcome]:
        """Block until at least one running job finishes, fails or times out."""
        running = [w for w in self._workers if w.job is not None]
        while True:
            now = time.monotonic()
            deadline = min(w.started + self._timeout for w in running)
            ready = wait([w.conn for w in running] + [w.process.sentinel for w in running],
                         timeout=max(0.0, deadline - now))
            outcomes = [self._collect(w, ready) for w in running]
            done = [o for o in outcomes if o is not None]
            if done:
                return done

    def _collect(self, worker: _Worker, ready: list) -> Outcome | None:
        elapsed = time.monotonic() - worker.started
        job_id = worker.job
        if worker.conn in ready:
            try:
                got_id, status, value = worker.conn.recv()
            except (EOFError, OSError):
                return self._replace(worker, Outcome(job_id, "crash", self._crash_message(worker), elapsed))
            worker.job = None
            return Outcome(got_id, status, value, elapsed)
        if worker.process.sentinel in ready:
            return self._replace(worker, Outcome(job_id, "crash", self._crash_message(worker), elapsed))
        if elapsed >= self._timeout:
            return self._replace(worker, Outcome(job_id, "timeout", f"no result after {self._timeout:g} s", elapsed))
        return None

    @staticmethod
    def _crash_message(worker: _Worker) -> str:
        worker.process.join(timeout=5)
        return f"the compile worker died (exit code {worker.process.exitcode})"

    def _replace(self, worker: _Worker, outcome: Outcome) -> Outcome:
        """Retire a crashed or timed-out worker; the next submit starts a fresh one."""
        worker.job = None
        worker.stop(kill=True)
        self._workers.remove(worker)
        return outcome
