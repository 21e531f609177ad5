"""A child process for tests/test_launcher.py: `python -m tests.child WHAT`.

events  prints three events (and a stray line that is not JSON), exits 0
hang    starts a grandchild that sleeps, says its pid, then sleeps itself
chatty  prints an event every 50 ms, forever
fail    writes a traceback to stderr and exits 3
killed  kills itself with SIGKILL
where   says how it started: forked by the zygote or not, its directory, a variable of its environment
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time


def say(event: dict) -> None:
    print(json.dumps(event), flush=True)


def main(what: str) -> int:
    if what == "events":
        for step in (1, 2, 3):
            say({"event": "step", "step": step})
        print("a library's stray print", flush=True)
        return 0
    if what == "hang":
        grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        say({"event": "started", "pid": grandchild.pid})
        time.sleep(600)
    if what == "chatty":
        for step in range(10**6):
            say({"event": "step", "step": step})
            time.sleep(0.05)
    if what == "fail":
        print("Traceback (most recent call last):\n  File 'x.py'", file=sys.stderr)
        print("ValueError: the last line says why\n", file=sys.stderr)
        return 3
    if what == "where":
        forked = os.environ.get("TRAINWISE_FORKED") == "1"
        say({"event": "where", "forked": forked, "cwd": os.getcwd(), "var": os.environ.get("TW_TEST_VAR")})
        return 0
    if what == "killed":
        os.kill(os.getpid(), signal.SIGKILL)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
