"""Fault injection (#13): hosts killed at bad moments, and many cold processes at once. Prints JSON lines.

- ``hung_host_killed``: a host calibrating a family whose step hangs is SIGKILLed; is its worker gone 2 s
  later? (parent-death signal and watchdog)
- ``random_kills``: a host calibrating two families is SIGKILLed at a uniformly random moment; does the
  results file still load, with every family that finished, and are temp files cleaned by the next save?
- ``single_flight``: N cold processes ask for the same family at once; how many calibrations ran, and did
  they all get the same answer?
- ``app_kills`` (#28): an app that has imported torch runs ``calibrate(['tiny_mlp', 'mlp'], force=True)`` and is
  SIGKILLed at a uniformly random moment, again and again in one cache directory; does every results file
  still load, is any corrupt or quarantined, are temp files left, and is any of its workers alive 1 s later?

    python benchmarks/fault_injection.py [--hung 10] [--kills 50] [--processes 8] [--app-kills 50]
                                         [--only hung_host_killed|random_kills|single_flight|app_kills]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import emit

from autotune._cache import schema
from autotune._cache.disk import load_json

TESTS = str(Path(__file__).parent.parent / "tests")
LINUX = sys.platform.startswith("linux")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


def _env(cache: str) -> dict[str, str]:
    return {**os.environ, "AUTOTUNE_CACHE_DIR": cache, "AUTOTUNE_BUDGET_S": "0.5", "AUTOTUNE_SEARCH": "precision",
            "PYTHONPATH": TESTS}


HUNG = """
import autotune
from autotune._lab.protocol import CalibrationSettings
from autotune._lab.host.worker import Worker
autotune.register_family("hang", "families_for_tests:build_hang")
worker = Worker(isolation="subprocess", timeout_s=600)
worker.start()
print(worker.pid, flush=True)
worker.run_family(autotune.get_family("hang"), CalibrationSettings(search="precision"))
"""


def hung_host_killed(runs: int) -> None:
    left = 0
    for _ in range(runs):
        host = subprocess.Popen([sys.executable, "-c", HUNG], stdout=subprocess.PIPE, text=True,
                                env=_env(tempfile.mkdtemp()))
        assert host.stdout is not None
        pid = int(host.stdout.readline())
        time.sleep(4.0)  # imported torch, verified fp32, now inside the hung candidate
        host.send_signal(signal.SIGKILL)
        host.wait()
        time.sleep(2.0)
        left += _alive(pid)
        if _alive(pid):
            os.killpg(pid, signal.SIGKILL)
    emit({"benchmark": "fault_injection", "what": "hung_host_killed", "runs": runs, "workers_alive_2s_later": left})


TWO = "import autotune; autotune.calibrate(['tiny', 'tiny_cnn'])"
PRELUDE = ("import autotune; autotune.register_family('tiny', 'families_for_tests:build_tiny'); "
           "autotune.register_family('tiny_cnn', 'families_for_tests:build_tiny_cnn'); ")


def random_kills(kills: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", PRELUDE + TWO], check=True, env=_env(tempfile.mkdtemp()))
    full_s = time.perf_counter() - started
    loaded = kept = temp_after_next = 0
    families: list[int] = []
    for _ in range(kills):
        cache = tempfile.mkdtemp()
        host = subprocess.Popen([sys.executable, "-c", PRELUDE + TWO], env=_env(cache), stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.0, full_s))
        host.send_signal(signal.SIGKILL)
        host.wait()
        check = subprocess.run(
            [sys.executable, "-c", PRELUDE + "from autotune._answer import cached_families; "
             "import json; print(json.dumps(sorted(cached_families())))"],
            env=_env(cache), capture_output=True, text=True, check=False)
        if check.returncode == 0:
            loaded += 1
            found = json.loads(check.stdout.strip().splitlines()[-1])
            families.append(len(found))
            kept += all(f in ("tiny", "tiny_cnn") for f in found)
        subprocess.run([sys.executable, "-c", PRELUDE + TWO], env=_env(cache), check=False, capture_output=True)
        temp_after_next += sum(1 for p in Path(cache).rglob("*") if p.name.endswith(".tmp"))
    emit({"benchmark": "fault_injection", "what": "random_kills", "kills": kills,
          "full_calibration_s": round(full_s, 1), "results_file_loaded": loaded, "records_intact": kept,
          "families_kept_per_kill": {n: families.count(n) for n in sorted(set(families))},
          "temp_files_after_next_run": temp_after_next})


FLIGHT = """
import json, os, sys, time, logging
sys.path.insert(0, {tests!r})
records = []
class Catch(logging.Handler):
    def emit(self, record):
        records.append(record.getMessage())
logging.getLogger("autotune").addHandler(Catch()); logging.getLogger("autotune").setLevel(logging.INFO)
import autotune
autotune.register_family("tiny", "families_for_tests:build_tiny")
while not os.path.exists({barrier!r}):
    time.sleep(0.005)
config = autotune.best_config("tiny")
calibrated = sum(m.startswith("calibrating tiny") for m in records)
print(json.dumps({{"config": config.model_dump(), "calibrated": calibrated}}))
"""


def single_flight(processes: int) -> None:
    cache = tempfile.mkdtemp()
    barrier = os.path.join(tempfile.mkdtemp(), "go")
    hosts = [subprocess.Popen([sys.executable, "-c", FLIGHT.format(tests=TESTS, barrier=barrier)], env=_env(cache),
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
             for _ in range(processes)]
    time.sleep(3.0)  # every host has imported autotune and waits at the barrier
    Path(barrier).touch()
    answers = [json.loads(h.communicate(timeout=300)[0].strip().splitlines()[-1]) for h in hosts]
    configs = {json.dumps(a["config"], sort_keys=True) for a in answers}
    emit({"benchmark": "fault_injection", "what": "single_flight", "processes": processes,
          "calibrations": sum(a["calibrated"] for a in answers), "distinct_answers": len(configs)})


APP = "import torch\nimport autotune\nautotune.calibrate(['tiny_mlp', 'mlp'], force=True)\n"


def _marked(mark: str) -> list[int]:
    """Live processes whose environment holds ``mark`` (inherited from the app: its workers, and theirs)."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            marked = mark.encode() + b"\0" in Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:  # gone meanwhile, or another user's
            continue
        if marked and _alive(int(entry)):
            found.append(int(entry))
    return found


def _loads(cache: Path) -> bool:
    """Every results file in ``cache`` reads as a results file, each family valid (nothing is moved aside)."""
    for path in cache.glob("*.json"):
        try:
            document = load_json(path.read_bytes())
        except (ValueError, RecursionError):
            return False
        if not isinstance(document, dict) or schema.judge(document) is not None or schema.families(document)[1]:
            return False
    return True


def app_kills(kills: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    cache = Path(tempfile.mkdtemp())
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", APP], check=True, env=_env(str(cache)), capture_output=True)
    full_s = time.perf_counter() - started
    loaded = temp_after_kill = workers_left = 0
    for kill in range(kills):
        token = f"{os.getpid()}-{seed}-{kill}"
        app = subprocess.Popen([sys.executable, "-c", APP], env={**_env(str(cache)), "FAULT_INJECTION_APP": token},
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.0, full_s))
        app.send_signal(signal.SIGKILL)
        app.wait()
        time.sleep(1.0)
        left = _marked(f"FAULT_INJECTION_APP={token}")
        workers_left += len(left)
        for pid in left:  # the next app starts on a quiet machine
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        loaded += _loads(cache)
        temp_after_kill += sum(1 for p in cache.iterdir() if p.name.endswith(".tmp"))
    subprocess.run([sys.executable, "-c", APP], check=True, env=_env(str(cache)), capture_output=True)
    emit({"benchmark": "fault_injection", "what": "app_kills", "kills": kills, "full_calibration_s": round(full_s, 1),
          "loads_ok": loaded, "corrupt": kills - loaded, "quarantined": sum(1 for _ in cache.glob("*.corrupt-*")),
          "temp_files_seen_after_a_kill": temp_after_kill,
          "temp_files_left": sum(1 for p in cache.iterdir() if p.name.endswith(".tmp")),
          "workers_alive_1s_after_the_kill": workers_left})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hung", type=int, default=10)
    parser.add_argument("--kills", type=int, default=50)
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--app-kills", type=int, default=50)
    parser.add_argument("--only", choices=["hung_host_killed", "random_kills", "single_flight", "app_kills"])
    args = parser.parse_args()
    if LINUX and args.only in (None, "hung_host_killed"):
        hung_host_killed(args.hung)
    if args.only in (None, "random_kills"):
        random_kills(args.kills)
    if args.only in (None, "single_flight"):
        single_flight(args.processes)
    if LINUX and args.only in (None, "app_kills"):
        app_kills(args.app_kills)


if __name__ == "__main__":
    main()
