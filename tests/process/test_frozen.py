"""The shipped app: a PyInstaller one-folder build of a tiny entry point that calls nothing but ``best_config``
calibrates on its first launch (autotune's hook makes the app its own worker), runs its main once, and leaves no
process behind; its second launch answers from the cache. The slowest test here (the build: minutes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

import autotune

APP = textwrap.dedent("""
    import json, os
    import autotune

    with open(os.environ["APP_MAINS"], "a") as f:
        f.write(f"{os.getpid()}\\n")
    cfg = autotune.best_config("tiny_mlp")
    print(json.dumps({"source": cfg.source, "device": cfg.device, "precision": cfg.precision}))
""")


@pytest.fixture(scope="module")
def frozen_app(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, float]:
    """The app, built once for this module: ``pyinstaller app.py`` with no option about autotune (``--paths`` only
    where autotune is installed editable, which PyInstaller's analysis cannot follow), and how long it took."""
    root = tmp_path_factory.mktemp("frozen")
    started = time.perf_counter()
    (root / "app.py").write_text(APP)
    build = subprocess.run(
        [sys.executable, "-m", "PyInstaller", "--noconfirm", "--onedir", "--log-level", "WARN",
         "--paths", str(Path(autotune.__file__).parent.parent), "--distpath", str(root / "dist"),
         "--workpath", str(root / "build"), "--specpath", str(root), str(root / "app.py")],
        capture_output=True, text=True, cwd=root, timeout=1200)
    assert build.returncode == 0, build.stderr[-3000:]
    return root / "dist" / "app" / ("app.exe" if sys.platform == "win32" else "app"), time.perf_counter() - started


def _launch(app: Path, tmp_path: Path) -> tuple[dict[str, str], float]:
    started = time.perf_counter()
    run = subprocess.run([str(app)], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "APP_MAINS": str(tmp_path / "mains")})
    took = time.perf_counter() - started
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.splitlines()[-1]), took


def _running_from(folder: Path) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["exe"]):
        exe = proc.info["exe"]
        if exe and Path(exe).is_relative_to(folder):
            found.append(proc)
    return found


def test_a_frozen_app_calibrates_on_its_first_launch(
    frozen_app: tuple[Path, float], tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    app, build_s = frozen_app
    first, first_s = _launch(app, tmp_path)
    assert first["source"] == "measured"
    assert len((tmp_path / "mains").read_text().split()) == 1  # the worker was the app, but never ran its main
    assert _running_from(app.parent) == []  # no worker, no copy of the app left

    second, second_s = _launch(app, tmp_path)
    assert second == first  # from the cache
    with capsys.disabled():  # the figures a closing note reports; nothing asserts on them
        print(f"\nfrozen app: built in {build_s:.0f} s; first launch {first_s:.1f} s, second {second_s:.1f} s")
