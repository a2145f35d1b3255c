"""Ctrl-C in a command's first few tenths of a second, while its modules import: one line and
exit 130, as the README promises, never a KeyboardInterrupt traceback."""

from __future__ import annotations

import signal
import subprocess
import sys

# The console script's own lines, run after an import finder that holds the import of
# mono_jit.api (the slowest of the commands' modules) open until the interrupt arrives.
_SCRIPT = """
import sys, time

class HoldImport:
    def find_spec(self, name, path=None, target=None):
        if name == "mono_jit.api":
            print("importing", flush=True)
            time.sleep(30)
        return None

sys.meta_path.insert(0, HoldImport())
sys.argv = ["mono-jit", "list"]
from mono_jit.cli import main
sys.exit(main())
"""


def test_ctrl_c_while_the_commands_import_is_one_line_and_exit_130():
    child = subprocess.Popen([sys.executable, "-c", _SCRIPT], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    assert child.stdout is not None and child.stdout.readline() == "importing\n"
    child.send_signal(signal.SIGINT)
    _, err = child.communicate(timeout=20)
    assert child.returncode == 130, err
    assert "Traceback" not in err and err.strip().count("\n") == 0, err
    assert err.strip() == "mono-jit: interrupted before it began: nothing was done", err
