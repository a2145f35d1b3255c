"""Compile workers: fresh interpreters that each run many compile jobs, one at a time.

A crash or abort inside MLIR kills only its worker (the job fails, a fresh worker replaces it);
a job past its timeout has its worker killed. A worker is a new Python process running this
module's ``serve``: not a fork, and not multiprocessing's spawn, which re-imports the caller's
``__main__`` (a script without an ``if __name__ == "__main__"`` guard would run again inside
the worker). It starts with exactly the given environment, so FlyDSL sees the sanitised variables
(toolchain.compile_environment), and with the caller's sys.path, so the target, pickled by
reference, imports as it does in the caller. Jobs and results travel over two private pipes.

For bytes that repeat (pipeline/repeatable.py) a worker runs without address-space
randomisation and with one hash seed, loads what the jobs need once (the pool's `preload`), then
forks one child per job: the child reads the job, runs it on a thread of its own (a fresh malloc
arena), answers and exits, so every job starts from the same memory whatever the worker ran
before. A child that dies takes its worker with it
the same way (signal or exit code), so the caller sees the crash as before.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any, Callable, Iterable, Iterator

from .repeatable import in_own_arena, seeded, without_aslr

# argv: the job pipe's fd, the result pipe's fd, then the caller's sys.path.
_BOOT = "import sys; sys.path[:] = sys.argv[3:]; from mono_jit.pipeline.workers import boot; boot()"
_END_OF_JOBS = 3  # a job child's exit code when there is no job left (0: it answered one)


@dataclass(frozen=True)
class Outcome:
    job_id: Any
    status: str  # "ok", "error", "timeout" or "crash"
    value: Any = None  # the result on "ok"; a message otherwise
    seconds: float = 0.0


def _error(exc: BaseException) -> str:
    detail = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {detail}\n{traceback.format_exc(limit=6)}"


def boot() -> None:
    """A worker's start (argv as `_BOOT` gives it): once without address-space randomisation,
    then `serve`."""
    without_aslr(["-c", _BOOT, *sys.argv[1:]])
    serve(int(sys.argv[1]), int(sys.argv[2]))


def serve(jobs_fd: int, results_fd: int) -> None:
    """The worker's loop: receive (target, preload), run preload, then fork a child per job
    until a child finds None or the end of input."""
    jobs, results = Connection(jobs_fd, writable=False), Connection(results_fd, readable=False)
    try:
        target, preload = jobs.recv()
        broken = None
        if preload is not None:
            preload()
    except EOFError:
        return
    except BaseException as exc:  # the target does not import or preload fails here: every job says why
        target, broken = None, _error(exc)
    while True:
        child = os.fork()
        if child == 0:
            code = 1
            try:
                code = _answer_one(jobs, results, target, broken)
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        status = os.waitpid(child, 0)[1]
        if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
            continue
        if os.WIFEXITED(status) and os.WEXITSTATUS(status) == _END_OF_JOBS:
            return
        _die_as(status)


def _answer_one(jobs: Connection, results: Connection, target: Any, broken: str | None) -> int:
    """In a job child: receive one (job_id, args), send (job_id, status, value); the exit code."""
    try:
        message = jobs.recv()
    except EOFError:
        return _END_OF_JOBS
    if message is None:
        return _END_OF_JOBS
    job_id, args = message
    if broken is not None:
        results.send((job_id, "error", broken))
        return 0
    try:
        results.send((job_id, "ok", in_own_arena(target, *args)))
    except BaseException as exc:  # report everything; the parent decides
        results.send((job_id, "error", _error(exc)))
    return 0


def _die_as(status: int) -> None:
    """End this worker the way its job child ended (the signal, else the exit code)."""
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        if number != signal.SIGKILL:  # SIGKILL has no handler to reset
            signal.signal(number, signal.SIG_DFL)
        os.kill(os.getpid(), number)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


class _Worker:
    def __init__(self, env: dict[str, str], target: Callable[..., Any], preload: Callable[[], None] | None) -> None:
        jobs_r, jobs_w = os.pipe()
        results_r, results_w = os.pipe()
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-c", _BOOT, str(jobs_r), str(results_w), *sys.path],
                env=seeded(env), stdin=subprocess.DEVNULL, pass_fds=(jobs_r, results_w),
                start_new_session=True,  # its own process group: `stop` kills a running job child too
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
        self.send((target, preload))

    def send(self, message: Any) -> None:
        self.jobs.send(message)

    def stop(self, kill: bool = False) -> None:
        if kill:
            self._kill()
        else:
            try:
                self.send(None)
            except OSError:
                pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._kill()
            self.process.wait()
        self.jobs.close()
        self.conn.close()

    def _kill(self) -> None:
        """SIGKILL to the worker and its job child (one process group)."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass  # the group is gone: the worker and its child have both ended


_END = object()


class WorkerPool:
    """`size` workers calling `target(*args)` for each submitted job; each worker calls
    `preload()` once before its first job (what every job would import)."""

    def __init__(self, size: int, env: dict[str, str], target: Callable[..., Any], timeout: float,
                 preload: Callable[[], None] | None = None) -> None:
        if size < 1:
            raise ValueError(f"jobs={size}: expected at least 1 worker")
        self._env, self._target, self._timeout, self._preload = env, target, timeout, preload
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
            worker = _Worker(self._env, self._target, self._preload)
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
