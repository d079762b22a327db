"""What a whole calibration, host and worker, does to the machine: no socket, and files written only under the
cache directory, but for the few the README names.

Audit hooks cannot be removed, so the hook lives in a ``sitecustomize`` on PYTHONPATH of a fresh host process;
the spawned calibration worker inherits the environment and installs it too. It refuses every socket creation and
records every file operation that writes (an ``open`` that may write or create, a rename, removal, directory
creation or removal, a change of mode, owner or times, a copy or move), with its absolute path and the process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).parents[1]

SITECUSTOMIZE = '''
import json, os, sys

_log = os.environ["FOOTPRINT_LOG"]
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_CHANGES = {"os.rename", "os.remove", "os.mkdir", "os.rmdir", "os.chmod", "os.chown", "os.truncate", "os.link",
            "os.symlink", "os.utime", "shutil.copyfile", "shutil.copymode", "shutil.copystat", "shutil.copytree",
            "shutil.move", "shutil.rmtree"}


def _note(what):
    with open(_log, "a") as f:
        f.write(json.dumps({"pid": os.getpid(), **what}) + "\\n")


def _tempdir_probe():
    """Whether the stack holds the standard library's check that the temporary directory is writable."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_name == "_get_default_tempdir" and frame.f_code.co_filename.endswith("tempfile.py"):
            return True
        frame = frame.f_back
    return False


def _footprint(event, args):
    if event == "socket.__new__":
        _note({"event": "socket"})
        raise PermissionError("autotune test: no network, no sockets")
    if event == "open":
        path, mode, flags = args
        writes = any(c in mode for c in "wax+") if mode is not None else bool(flags & _WRITE_FLAGS)
        paths = [path] if writes and isinstance(path, (str, bytes, os.PathLike)) else []
    elif event in _CHANGES:
        paths = [a for a in args if isinstance(a, (str, bytes, os.PathLike))]
    else:
        return
    for path in paths:
        path = os.path.abspath(os.fsdecode(path))
        if path != _log:
            _note({"event": event, "path": path, "probe": _tempdir_probe()})


sys.addaudithook(_footprint)
_note({"event": "installed"})
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


def _outside(path: Path, root: Path) -> bool:
    return path != root and root not in path.parents


def test_a_whole_calibration_opens_no_socket_and_writes_only_under_the_cache_dir(tmp_path: Path) -> None:
    hook_dir = tmp_path / "hook"
    hook_dir.mkdir()
    (hook_dir / "sitecustomize.py").write_text(SITECUSTOMIZE)
    log = tmp_path / "footprint.log"
    cache = tmp_path / "cache"
    temp = tmp_path / "temp"  # the machine's temporary directory, as both processes see it
    temp.mkdir()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(hook_dir), str(TESTS)]),
        # Python's own .pyc files of what the processes import are the interpreter's writes, not autotune's.
        "PYTHONDONTWRITEBYTECODE": "1",
        "TMPDIR": str(temp), "TEMP": str(temp), "TMP": str(temp),
        "FOOTPRINT_LOG": str(log),
        "AUTOTUNE_CACHE_DIR": str(cache),
        "AUTOTUNE_ISOLATION": "subprocess",  # the worker must run under the hook too
        "AUTOTUNE_SEARCH": "precision",
        "AUTOTUNE_BUDGET_S": "0.2",
    }
    # torch sets it in the environment of a process that touched its compiler (an earlier test in this one)
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    done = subprocess.run([sys.executable, "-c", HOST], capture_output=True, text=True, env=env, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer["source"] == "measured" and answer["device"] == "cpu" and answer["candidates"] >= 1

    seen = [json.loads(line) for line in log.read_text().splitlines()]
    assert len({s["pid"] for s in seen if s["event"] == "installed"}) >= 2, "the hook ran in the host and worker"
    sockets = [s for s in seen if s["event"] == "socket"]
    assert len(sockets) == 1, f"only the host's own probe tried a socket: {sockets}"

    writes = [s for s in seen if "path" in s]
    assert any(not _outside(Path(s["path"]), cache) for s in writes), "the calibration stored its results"
    user = os.getuid() if hasattr(os, "getuid") else os.environ.get("USERNAME", "user")
    named_in_readme = {
        temp / f"autotune-{user}",  # the per-user measuring lock's directory, and the lock
        temp / f"autotune-{user}" / "measuring.lock",
        Path("/proc/self/clear_refs"),  # the worker resets its peak resident size (Linux): no file on disk
    }
    elsewhere = [
        s for s in writes if _outside(Path(s["path"]), cache) and Path(s["path"]) not in named_in_readme
        # Python's tempfile checks the temporary directory is writable: a file created and removed at once
        and not (s["probe"] and Path(s["path"]).parent == temp)
        # torch makes its compiler's cache directory when the first optimizer step imports torch._dynamo
        and not (s["event"] == "os.mkdir" and Path(s["path"]).parent == temp
                 and Path(s["path"]).name.startswith("torchinductor_"))
    ]
    assert elsewhere == [], f"writes outside {cache}: {elsewhere}"
