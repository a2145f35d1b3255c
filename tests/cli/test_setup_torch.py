"""scripts/install-torch.sh, the set-up's torch step: torch's CPU build from PyTorch's CPU-only
index when it answers, else one line of notice and pip's configured index, losing at most the
3 s probe. pip is a recorder here (nothing is installed); the index is a local HTTP server, a
port that refuses, or one that never answers."""

from __future__ import annotations

import functools
import http.server
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "install-torch.sh"
QUIET = "install -q --disable-pip-version-check"


@pytest.fixture
def recorder(tmp_path) -> tuple[Path, Path]:
    """A python that records `-m pip ...` calls in a log (failing the first PIP_FAILURES of them)
    and runs everything else with this interpreter; and the log."""
    log = tmp_path / "pip.log"
    python = tmp_path / "python"
    python.write_text(f"""#!/usr/bin/env bash
if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then
  shift 2
  echo "$*" >> "{log}"
  [ "$(wc -l < "{log}")" -gt "${{PIP_FAILURES:-0}}" ]
  exit
fi
exec "{sys.executable}" "$@"
""")
    python.chmod(0o755)
    return python, log


def install(python: Path, index: str, failures: int = 0) -> tuple[subprocess.CompletedProcess, float]:
    env = {"PATH": "/usr/bin:/bin", "TORCH_CPU_INDEX": index, "PIP_FAILURES": str(failures)}
    start = time.monotonic()
    done = subprocess.run(["bash", str(SCRIPT), str(python), "2.13.0"], env=env, capture_output=True, text=True,
                          timeout=60)
    return done, time.monotonic() - start


def calls(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


@pytest.fixture
def cpu_index(tmp_path) -> str:
    """A local package index holding a torch/ page."""
    (tmp_path / "index" / "torch").mkdir(parents=True)
    (tmp_path / "index" / "torch" / "index.html").write_text("<html></html>")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path / "index"))
    handler.log_message = lambda *args: None  # type: ignore[attr-defined]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


def test_the_cpu_index_is_used_when_it_answers(recorder, cpu_index):
    python, log = recorder
    done, _ = install(python, cpu_index)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert calls(log) == [f"{QUIET} --index-url {cpu_index} --timeout 15 --retries 0 torch==2.13.0+cpu"]


def test_an_index_that_refuses_falls_back_at_once_with_one_line(recorder):
    python, log = recorder
    with socket.socket() as probe:  # a port nobody listens on: the connection is refused
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    done, seconds = install(python, f"http://127.0.0.1:{port}/whl/cpu")
    assert done.returncode == 0 and seconds < 3, (done.stderr, seconds)
    assert calls(log) == [f"{QUIET} torch==2.13.0"]
    assert done.stderr == (f"setup: PyTorch's CPU-only index http://127.0.0.1:{port}/whl/cpu: not reached "
                           "within 3 s; installing torch==2.13.0 from pip's configured index instead (from PyPI "
                           "that is the CUDA build, several GB more)\n")


def test_an_index_that_never_answers_costs_at_most_the_probe(recorder):
    python, log = recorder
    with socket.socket() as silent:  # accepts connections (the backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        done, seconds = install(python, f"http://127.0.0.1:{silent.getsockname()[1]}/")
    assert done.returncode == 0 and 2.5 < seconds < 6, seconds
    assert calls(log) == [f"{QUIET} torch==2.13.0"] and "not reached within 3 s" in done.stderr


def test_a_failed_install_from_the_cpu_index_falls_back(recorder, cpu_index):
    python, log = recorder
    done, _ = install(python, cpu_index, failures=1)
    assert done.returncode == 0 and "installing from it failed" in done.stderr
    assert calls(log) == [f"{QUIET} --index-url {cpu_index} --timeout 15 --retries 0 torch==2.13.0+cpu",
                          f"{QUIET} torch==2.13.0"]


def test_a_failed_fallback_fails_the_set_up(recorder):
    python, log = recorder
    done, _ = install(python, "http://127.0.0.1:1/", failures=1)
    assert done.returncode != 0 and len(calls(log)) == 1


def test_setup_installs_torch_through_it_when_torch_is_missing():
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert '.venv/bin/python -c "import torch" 2>/dev/null || bash scripts/install-torch.sh .venv/bin/python ' \
           '2.13.0' in setup
    assert "pip install -q --disable-pip-version-check torch==" not in setup
