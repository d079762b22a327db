"""A whole calibration, host and worker, with every socket creation refused by an audit hook.

Audit hooks cannot be removed, so the hook lives in a ``sitecustomize`` on PYTHONPATH of a fresh host process;
the spawned calibration worker inherits the environment and installs it too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).parent

SITECUSTOMIZE = '''
import os, sys

_log = os.environ["NO_NETWORK_LOG"]

def _refuse_sockets(event, args):
    if event == "socket.__new__":
        with open(_log, "a") as f:
            f.write(f"refused {os.getpid()} {args!r}\\n")
        raise PermissionError("autotune test: no network, no sockets")

sys.addaudithook(_refuse_sockets)
with open(_log, "a") as f:
    f.write(f"installed {os.getpid()}\\n")
'''

HOST = '''
import json, socket
import autotune

try:
    socket.socket()
except PermissionError:
    pass
else:
    raise SystemExit("the audit hook did not refuse a socket")
autotune.register_family("tiny", "families_for_tests:build_tiny")
report = autotune.calibrate(["tiny"])
config = autotune.best_config("tiny")
print(json.dumps({"device": config.device, "source": config.source,
                  "candidates": len(report.measurements["tiny"].candidates)}))
'''


def test_a_whole_calibration_runs_with_every_socket_refused(tmp_path: Path) -> None:
    hook_dir = tmp_path / "hook"
    hook_dir.mkdir()
    (hook_dir / "sitecustomize.py").write_text(SITECUSTOMIZE)
    log = tmp_path / "sockets.log"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(hook_dir), str(TESTS)]),
        "NO_NETWORK_LOG": str(log),
        "AUTOTUNE_ISOLATION": "subprocess",  # the worker must run under the hook too
        "AUTOTUNE_SEARCH": "precision",
        "AUTOTUNE_BUDGET_S": "0.2",
    }
    done = subprocess.run([sys.executable, "-c", HOST], capture_output=True, text=True, env=env, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer["source"] == "measured" and answer["device"] == "cpu" and answer["candidates"] >= 1
    lines = log.read_text().splitlines()
    installed = {line.split()[1] for line in lines if line.startswith("installed")}
    refused = [line for line in lines if line.startswith("refused")]
    assert len(installed) >= 2, "the hook ran in the host and in the calibration worker"
    assert len(refused) == 1, f"only the host's own probe tried a socket: {refused}"
