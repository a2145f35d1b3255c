"""Compile workers: fresh interpreters that each run many compile jobs, one at a time.

A crash or abort inside MLIR kills only its worker (the job fails, a fresh worker replaces it);
a job past its timeout has its worker killed. A worker is a new Python process running this
module's ``serve``: not a fork, and not multiprocessing's spawn, which re-imports the caller's
``__main__`` (a script without an ``if __name__ == "__main__"`` guard would run again inside
the worker). It starts with exactly the given environment, so FlyDSL sees the sanitised variables
(toolchain.compile_environment), and with the caller's sys.path, so the target, pickled by
reference, imports as it does in the caller. Jobs and results travel over two private pipes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any, Callable, Iterable, Iterator

# argv: the job pipe's fd, the result pipe's fd, then the caller's sys.path.
_BOOT = "import sys; sys.path[:] = sys.argv[3:]; from mono_jit.pipeline.workers import serve; serve(int(sys.argv[1]), int(sys.argv[2]))"


@dataclass(frozen=True)
class Outcome:
    job_id: Any
    status: str  # "ok", "error", "timeout" or "crash"
    value: Any = None  # the result on "ok"; a message otherwise
    seconds: float = 0.0


def _error(exc: BaseException) -> str:
    detail = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {detail}\n{traceback.format_exc(limit=6)}"


def serve(jobs_fd: int, results_fd: int) -> None:
    """The worker's loop: receive the target, then (job_id, args) until None or end of input."""
    jobs, results = Connection(jobs_fd, writable=False), Connection(results_fd, readable=False)
    try:
        target, broken = jobs.recv(), None
    except EOFError:
        return
    except BaseException as exc:  # the target does not import here: every job says why
        target, broken = None, _error(exc)
    while True:
        try:
            message = jobs.recv()
        except EOFError:
            return
        if message is None:
            return
        job_id, args = message
        if broken is not None:
            results.send((job_id, "error", broken))
            continue
        try:
            results.send((job_id, "ok", target(*args)))
        except BaseException as exc:  # report everything; the parent decides
            results.send((job_id, "error", _error(exc)))


class _Worker:
    def __init__(self, env: dict[str, str], target: Callable[..., Any]) -> None:
        jobs_r, jobs_w = os.pipe()
        results_r, results_w = os.pipe()
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-c", _BOOT, str(jobs_r), str(results_w), *sys.path],
                env=env, stdin=subprocess.DEVNULL, pass_fds=(jobs_r, results_w),
            )
        except BaseException:
            for fd in (jobs_w, results_r):
                os.close(fd)
            raise
        finally:
            for fd in (jobs_r, results_w):
                os.close(fd)
        self.conn = Connection(results_r, writable=False)
        self.jobs = Connection(jobs_w, readable=False)
        self.job: Any = None
        self.started = 0.0
        self.send(target)

    def send(self, message: Any) -> None:
        self.jobs.send(message)

    def stop(self, kill: bool = False) -> None:
        if kill:
            self.process.kill()
        else:
            try:
                self.send(None)
            except OSError:
                pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.jobs.close()
        self.conn.close()


_END = object()


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

    def run(self, items: Iterable[tuple[Any, tuple] | None]) -> Iterator[Outcome]:
        """Run (job_id, args) items, pulling the iterable only when a worker is idle, and yield
        each outcome as it finishes. Lazy pulling lets a caller decide per item, at dispatch
        time, whether it still needs compiling (e.g. after taking the key's lock); an item of
        None means "nothing ready yet": the pool pulls again after the next outcome."""
        pending = iter(items)
        exhausted = False
        while True:
            while not exhausted and self._busy() < self._size:
                item = next(pending, _END)
                if item is _END:
                    exhausted = True
                elif isinstance(item, tuple):
                    self._submit(*item)
                else:  # None: nothing ready yet
                    break
            if not self._busy():
                if exhausted:
                    return
                continue
            yield from self._wait()

    def _busy(self) -> int:
        return sum(1 for w in self._workers if w.job is not None)

    def _submit(self, job_id: Any, args: tuple) -> None:
        worker = next((w for w in self._workers if w.job is None), None)
        if worker is None:
            worker = _Worker(self._env, self._target)
            self._workers.append(worker)
        worker.send((job_id, args))
        worker.job, worker.started = job_id, time.monotonic()

    def _wait(self) -> list[Outcome]:
        """Block until at least one running job finishes, fails or times out."""
        running = [w for w in self._workers if w.job is not None]
        while True:
            now = time.monotonic()
            deadline = min(w.started + self._timeout for w in running)
            ready = wait([w.conn for w in running], timeout=max(0.0, deadline - now))
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
        if worker.process.poll() is not None:
            return self._replace(worker, Outcome(job_id, "crash", self._crash_message(worker), elapsed))
        if elapsed >= self._timeout:
            return self._replace(worker, Outcome(job_id, "timeout", f"no result after {self._timeout:g} s", elapsed))
        return None

    @staticmethod
    def _crash_message(worker: _Worker) -> str:
        try:
            code = worker.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        return f"the compile worker died (exit code {code})"

    def _replace(self, worker: _Worker, outcome: Outcome) -> Outcome:
        """Retire a crashed or timed-out worker; the next submit starts a fresh one."""
        worker.job = None
        worker.stop(kill=True)
        self._workers.remove(worker)
        return outcome
