"""First launch without blocking (#12): background job, answers without waiting, cancel, export/import,
bad import files, similar-machine fallback, and the canary's cost. One JSON line per figure.

    AUTOTUNE_BUDGET_S=1 python benchmarks/background.py [CANCELS]
    python benchmarks/background.py --canary [FAMILY ...]   # only the canary's cost, default budget, built-ins

Every section uses its own temporary cache dir; the user's cache is never touched.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import emit

import autotune
from autotune import _answer
from autotune._cache import lookup as _cached
from autotune._cli import main as cli
from autotune._fingerprint import Fingerprint

KINDS = ["tiny_mlp", "mlp"]
PROBE = ("import time, autotune; t = time.perf_counter(); c = autotune.best_config({kind!r}, wait=False); "
         "print(1e3 * (time.perf_counter() - t), c.source, '|', c.reason)")


def _cache(root: Path, name: str) -> Path:
    path = root / name
    os.environ["AUTOTUNE_CACHE_DIR"] = str(path)
    return path


def _workers() -> list[int]:
    me = os.getpid()
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            if ppid == me and b"autotune._lab.entry" in Path(f"/proc/{entry}/cmdline").read_bytes():
                found.append(int(entry))
    return found


def _locks_held(kinds: list[str]) -> int:
    import filelock

    held = 0
    for kind in kinds:
        lock = _cached.store().calibration_lock(autotune.fingerprint().digest, kind)
        try:
            lock.acquire(timeout=0)
        except filelock.Timeout:
            held += 1
        else:
            lock.release()
    return held


def _probe(kind: str) -> tuple[float, float, str, str]:
    started = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", PROBE.format(kind=kind)], capture_output=True, text=True,
                         check=True).stdout
    head, _, reason = out.partition(" | ")
    call_ms, source = head.split()
    return float(call_ms), time.perf_counter() - started, source, reason.strip()


def background(root: Path) -> float:
    _cache(root, "job")
    started = time.perf_counter()
    job = autotune.start_calibration(KINDS)
    start_ms = 1e3 * (time.perf_counter() - started)
    while job.progress is None or job.progress.family != "mlp":  # the second family: the first is stored
        time.sleep(0.01)
    calls = []
    for _ in range(2000):
        t = time.perf_counter()
        autotune.best_config("mlp", wait=False)
        calls.append(time.perf_counter() - t)
    answer = autotune.best_config("mlp", wait=False)
    call_ms, wall_s, source, reason = _probe("mlp")
    report = job.wait()
    emit({"benchmark": "background", "kind": "start_and_answer", "start_calibration_ms": round(start_ms, 2),
          "wait_false_in_process_us_median": round(1e6 * statistics.median(calls), 1),
          "wait_false_in_process_us_max": round(1e6 * max(calls), 1),
          "in_process": [answer.source, answer.reason],
          "second_process_call_ms": round(call_ms, 2), "second_process_wall_s": round(wall_s, 2),
          "second_process": [source, reason],
          "calibration_wall_s": round(report.wall_s, 2)})
    return report.wall_s


def cancels(root: Path, count: int, span_s: float) -> None:
    _cache(root, "cancel")
    rng = random.Random(12)
    rows = []
    for _ in range(count):
        autotune.clear_cache()  # each cancel hits a full calibration of both families
        job = autotune.start_calibration(KINDS)
        delay = rng.uniform(0.0, span_s)
        time.sleep(delay)
        job.cancel()
        try:
            finished = list(job.wait(60).measurements)
        except autotune.CalibrationCancelled as exc:
            finished = exc.finished
        served = [k for k in KINDS if autotune.best_config(k, wait=False).source == "measured"]
        rest = autotune.start_calibration(KINDS).wait()  # the next job measures the rest
        remeasured = [k for k in KINDS if k not in served and k in rest.measurements]
        kept = all(rest.measurements[k].measured_at == _answer.cached_families([k])[k].measured_at for k in served)
        rows.append({"moment_s": round(delay, 2), "workers_left": len(_workers()), "locks_held": _locks_held(KINDS),
                     "finished": finished, "served_measured": served, "next_job_measured": remeasured,
                     "finished_kept": kept})
    emit({"benchmark": "background", "kind": "cancel", "runs": rows,
          "workers_left_total": sum(r["workers_left"] for r in rows),
          "locks_held_total": sum(r["locks_held"] for r in rows),
          "all_finished_served": all(set(r["finished"]) <= set(r["served_measured"]) for r in rows)})


def _digest(cache: Path) -> str:
    sha = hashlib.sha256()
    for path in sorted(cache.rglob("*")):
        if path.is_file() and not path.name.endswith(".lock"):
            sha.update(path.name.encode() + path.read_bytes())
    return sha.hexdigest()[:12]


def exchange(root: Path) -> None:
    _cache(root, "job")
    exported = root / "results.json"
    count = autotune.export_results(exported)
    target = _cache(root, "imported")
    started = time.perf_counter()
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = cli(["--import", str(exported)])
    import_s = time.perf_counter() - started
    call_ms, _, source, reason = _probe("mlp")
    emit({"benchmark": "background", "kind": "export_import", "records": count, "import_exit": code,
          "import_s": round(import_s, 3), "answer_source": source, "answer_call_ms": round(call_ms, 2),
          "reason_tail": reason[-120:], "workers_started": len(_workers())})
    raw = exported.read_bytes()
    bad = {"truncated": raw[: len(raw) // 2], "wrong_schema": raw.replace(b'"candidates"', b'"candidatez"')}
    before = _digest(target)
    for name, content in [*bad.items(), ("100MB", None)]:
        path = root / f"bad-{name}.json"
        if content is None:
            with open(path, "wb") as f:
                f.truncate(100 * 2**20)
        else:
            path.write_bytes(content)
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            code = cli(["--import", str(path)])
        lines = [line for line in err.getvalue().splitlines() if line.strip()]
        emit({"benchmark": "background", "kind": "bad_import", "file": name, "exit": code, "stderr_lines": len(lines),
              "message": lines[0][:220] if lines else "", "cache_untouched": _digest(target) == before})


def similar(root: Path) -> None:
    _cache(root, "job")
    here = autotune.fingerprint()
    older = Fingerprint.model_validate({**here.model_dump(exclude={"digest"}), "torch": "2.12.0"})
    record = _answer.cached_families(["tiny_mlp"])["tiny_mlp"]
    _cache(root, "similar")
    _cached.store().save(older, record)
    config = autotune.best_config("tiny_mlp", wait=False)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = cli(["--family", "tiny_mlp"])
    printed = [line for line in err.getvalue().splitlines() if "measured with" in line]
    emit({"benchmark": "background", "kind": "similar", "source": config.source, "reason": config.reason[:200],
          "cli_exit": code, "cli_printed": printed})


def canary(root: Path, budget_s: str, kinds: list[str] = KINDS) -> float:
    """The canary's cost against a forced calibration of ``kinds``; returns that calibration's wall time."""
    _cache(root, "job")
    saved = os.environ.get("AUTOTUNE_BUDGET_S")
    os.environ["AUTOTUNE_BUDGET_S"] = budget_s
    started = time.perf_counter()
    calibration = autotune.calibrate(kinds, force=True).wall_s
    calibrate_s = time.perf_counter() - started
    out = io.StringIO()
    started = time.perf_counter()
    with contextlib.redirect_stdout(out):
        code = cli(["--check", *(word for kind in kinds for word in ("--family", kind))])
    check_s = time.perf_counter() - started
    if saved is None:
        del os.environ["AUTOTUNE_BUDGET_S"]
    else:
        os.environ["AUTOTUNE_BUDGET_S"] = saved
    emit({"benchmark": "background", "kind": "check", "families": kinds, "budget_s": float(budget_s),
          "calibration_s": round(calibrate_s, 2), "calibration_report_wall_s": round(calibration, 2),
          "check_s": round(check_s, 2),
          "fraction": round(check_s / calibrate_s, 3), "exit": code, "lines": out.getvalue().splitlines()})
    return calibrate_s


def main() -> None:
    if sys.argv[1:2] == ["--canary"]:
        with tempfile.TemporaryDirectory() as tmp:
            canary(Path(tmp), "8", sys.argv[2:] or ["tiny_mlp", "mlp", "cnn", "transformer"])
        return
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    os.environ.setdefault("AUTOTUNE_BUDGET_S", "1")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        background(root)
        exchange(root)
        similar(root)
        walls = [canary(root, budget_s)  # the script's budget (the cancels') and the default
                 for budget_s in dict.fromkeys([os.environ["AUTOTUNE_BUDGET_S"], "8"])]
        # Moments within a calibration of both families at the script's budget (the first job's wall is no
        # guide: it shares the machine with the 2000 answers and the second process timed meanwhile).
        cancels(root, count, span_s=walls[0])


if __name__ == "__main__":
    main()
