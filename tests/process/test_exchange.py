"""Export, import (untrusted input), the read-only defaults layer and similar-machine answers."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from samples import failed, family, timed

import autotune
from autotune._cache import demotions
from autotune._cache import exchange as _exchange
from autotune._cache import lookup as _cached
from autotune._cache.store import Store
from autotune._cli import main
from autotune._fingerprint import Fingerprint
from autotune._records import Candidate, Demotion, Difference, FamilyResult, MachineLoad, ProcessLoad


def _measured() -> FamilyResult:
    """Keyed for the test's settings (conftest's budget), so it serves as fresh."""
    return family("tiny_mlp", timed("cpu", "fp32", 2.0), timed("cpu", "bf16-mixed", 1.0))


def _other_torch(version: str = "2.12.0") -> Fingerprint:
    here = autotune.fingerprint()
    return Fingerprint.model_validate({**here.model_dump(exclude={"digest"}), "torch": version})


def _export_from(cache: Path, out: Path, fp: Fingerprint) -> None:
    Store(cache).save(fp, _measured())
    count = _exchange.export_results(Store(cache), out)
    assert sum(len(f.families) for f in count.files) == 1


def test_export_import_serves_as_measured_without_calibrating(tmp_path: Path, isolated_autotune: Path) -> None:
    out = tmp_path / "results.json"
    _export_from(tmp_path / "elsewhere", out, autotune.fingerprint())
    assert main(["--import", str(out)]) == 0
    config = autotune.best_config("tiny_mlp", wait=False)
    assert config.source == "measured" and config.precision == "bf16-mixed"
    assert "imported from results.json" in config.reason
    assert config.evidence is not None and config.evidence.origin is not None
    assert config.evidence.origin.startswith("imported from results.json (exported 20")
    assert autotune.best_config("tiny_mlp").measured_at == _measured().measured_at  # wait=True: still no calibration
    summary = autotune.import_results(out)  # an imported record may be replaced by another import
    assert len(summary.imported) == 1 and summary.kept == []


def test_import_keeps_what_was_measured_here(tmp_path: Path, isolated_autotune: Path) -> None:
    out = tmp_path / "results.json"
    _export_from(tmp_path / "elsewhere", out, autotune.fingerprint())
    mine = family("tiny_mlp", timed("cpu", "fp32", 1.0), timed("cpu", "bf16-mixed", 3.0))
    _cached.store().save(autotune.fingerprint(), mine)
    summary = autotune.import_results(out)
    assert summary.imported == [] and len(summary.kept) == 1
    assert autotune.best_config("tiny_mlp", wait=False).precision == "fp32"


def _cache_bytes(cache: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(cache.glob("*")) if p.is_file() and not p.name.endswith(".lock")}


@pytest.mark.parametrize("bad", ["truncated", "wrong_schema", "huge", "traversal", "not_json", "missing"])
def test_a_bad_import_file_is_one_clear_error_and_the_cache_is_untouched(
        bad: str, tmp_path: Path, isolated_autotune: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "good.json"
    _export_from(tmp_path / "elsewhere", good, _other_torch())
    _cached.store().save(autotune.fingerprint(), _measured())
    before = _cache_bytes(isolated_autotune)
    path = tmp_path / "bad.json"
    raw = good.read_bytes()
    if bad == "truncated":
        path.write_bytes(raw[: len(raw) // 2])
    elif bad == "wrong_schema":
        data = json.loads(raw)
        data["files"][0]["families"]["tiny_mlp"]["candidates"] = "rm -rf /"
        path.write_text(json.dumps(data))
    elif bad == "huge":
        with open(path, "wb") as f:
            f.truncate(100 * 2**20)
    elif bad == "traversal":
        data = json.loads(raw)
        record = data["files"][0]["families"].pop("tiny_mlp")
        record["model_kind"] = "../../evil"
        data["files"][0]["families"]["../../evil"] = record
        path.write_text(json.dumps(data))
    elif bad == "not_json":
        path.write_bytes(b"\x80\x04pickle")
    with pytest.raises(autotune.ImportFileError) as error:
        autotune.import_results(path)
    assert str(path) in str(error.value) and "Nothing was imported" in str(error.value)
    # A file that is not there is a wrong path, not a file to export again on the machine that measured it.
    assert str(error.value).endswith("check the path" if bad == "missing" else "on the machine that measured it")
    assert main(["--import", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.count("error") == 1 and "Nothing was imported" in err
    assert _cache_bytes(isolated_autotune) == before


def test_defaults_layer_serves_under_local_results(tmp_path: Path, isolated_autotune: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    shipped = tmp_path / "shipped.json"
    _export_from(tmp_path / "vendor", shipped, autotune.fingerprint())
    monkeypatch.setenv("AUTOTUNE_DEFAULTS", str(shipped))
    config = autotune.best_config("tiny_mlp", wait=False)
    assert config.source == "measured" and config.reason.endswith("), shipped in shipped.json")
    assert config.evidence is not None and config.evidence.origin == "shipped in shipped.json"
    assert autotune.calibrate(["tiny_mlp"]).measurements["tiny_mlp"].origin == "shipped in shipped.json"
    assert list(isolated_autotune.glob("*.json")) == []  # read-only: nothing written to the user's cache
    local = family("tiny_mlp", timed("cpu", "fp32", 1.0), timed("cpu", "bf16-mixed", 3.0))
    _cached.store().save(autotune.fingerprint(), local)
    assert autotune.best_config("tiny_mlp", wait=False).precision == "fp32"  # local measurements win
    autotune.use_defaults(None)
    with pytest.raises(autotune.ImportFileError):
        autotune.use_defaults(tmp_path / "missing.json")


def test_same_hardware_other_torch_is_the_fallback_and_names_the_difference(isolated_autotune: Path) -> None:
    _cached.store().save(_other_torch("2.12.0"), _measured())
    config = autotune.best_config("tiny_mlp", wait=False)
    assert config.source == "heuristic" and config.precision == "bf16-mixed"
    assert config.reason == ("bf16 mixed precision on the CPU: the pick measured with torch 2.12.0 on the same "
                             "hardware; not measured here yet (wait=False never measures)")
    assert config.evidence is not None and config.evidence.similar is not None
    assert config.evidence.similar.differences == [Difference(name="torch", then="2.12.0",
                                                              now=autotune.fingerprint().torch)]
    assert config.evidence.unmeasured == "wait=False never measures" and config.evidence.rivals
    other_cpu = Fingerprint.model_validate({**_other_torch().model_dump(exclude={"digest"}), "cpu_brand": "Other"})
    autotune.clear_cache()
    _cached.store().save(other_cpu, _measured())
    assert autotune.best_config("tiny_mlp", wait=False).precision == "fp32"  # other hardware: no similar answer


def test_cli_prints_what_changed_since_the_same_hardware_was_measured(
        isolated_autotune: Path, tiny_family: str, capsys: pytest.CaptureFixture[str]) -> None:
    _cached.store().save(_other_torch("2.12.0"), family(tiny_family, timed("cpu", "fp16-mixed", 1.0),
                                                      timed("cpu", "fp32", 2.0)))
    assert main(["--family", tiny_family]) == 0
    err = capsys.readouterr().err
    assert f"{tiny_family}: measured with torch 2.12.0; this is {autotune.fingerprint().torch}" in err
    assert "the pick was cpu fp16-mixed, now cpu " in err


def test_export_cli_and_import_in_another_process(tmp_path: Path, isolated_autotune: Path) -> None:
    _cached.store().save(autotune.fingerprint(), _measured())
    out = tmp_path / "out.json"
    assert main(["--export", str(out), "--family", "tiny_mlp"]) == 0
    env = {**os.environ, "AUTOTUNE_CACHE_DIR": str(tmp_path / "empty")}
    code = (f"import autotune; autotune.import_results({str(out)!r}); "
            "c = autotune.best_config('tiny_mlp', wait=False); print(c.source, c.precision)")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                          check=True)
    assert done.stdout.split() == ["measured", "bf16-mixed"]


def test_a_similar_machines_answer_leaves_out_what_training_demoted_here(isolated_autotune: Path) -> None:
    _cached.store().save(_other_torch("2.12.0"), _measured())
    assert autotune.best_config("tiny_mlp", wait=False).precision == "bf16-mixed"
    demotions.record(autotune.fingerprint().digest, Demotion(
        model_kind="tiny_mlp", candidate=Candidate(device="cpu", precision="bf16-mixed"), seen="non_finite", step=10,
        detail="3 NaN losses", evidence=[float("nan")], at="2026-12-02", autotune_version="0"))
    assert autotune.best_config("tiny_mlp", wait=False).precision == "fp32"  # what guard.fallback() answers


#: what a file may carry to a terminal: clear the screen, a carriage return over what precedes it, a C1 CSI, a
#: window title (OSC ... BEL), and a claim of where the record came from
HOSTILE = "\x1b[2J\rmeasured at ACME labs\x9b31m\x1b]0;owned\x07"
#: any control character but the line feeds the output is made of
RAW = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")


def _hostile_export(path: Path, cache: Path) -> None:
    """An export of this machine's tiny_mlp, written by hand, whose free text all carries :data:`HOSTILE`, two
    strings of it 10,000 characters long: the record's own claim of its origin, a failure's detail, backend and
    search notes, a busy process's name."""
    Store(cache).save(autotune.fingerprint(), family("tiny_mlp", timed("cpu", "fp32", 2.0),
                                                     timed("cpu", "bf16-mixed", 1.0), noisy=True))
    _exchange.export_results(Store(cache), path)
    document = json.loads(path.read_bytes())
    record = document["files"][0]["families"]["tiny_mlp"]
    record["candidates"].append(failed("cpu", "fp16-mixed", "error", HOSTILE + "B" * 10_000).model_dump(mode="json"))
    record.update(origin=HOSTILE + "A" * 10_000, backend_notes={"cuda": HOSTILE}, search_notes=[HOSTILE],
                  noisy_because=["other_processes"], loads=[MachineLoad(window_s=1.0, other_cores=0.9, processes=[
                      ProcessLoad(name=HOSTILE, pid=4242, cores=0.9)]).model_dump(mode="json")])
    path.write_text(json.dumps(document))
    assert "\\u001b[2J\\r" in path.read_text()  # JSON's escapes: the reader decodes them to the characters


def _unsaid(text: str) -> None:
    """Nothing of :data:`HOSTILE` reaches ``text`` raw, and no string from the file runs to 10,000 characters."""
    assert RAW.search(text) is None, repr(RAW.search(text))
    assert "A" * 1_000 not in text and "B" * 1_000 not in text


def test_text_from_an_imported_file_reaches_the_terminal_printable_and_its_origin_is_the_files_name(
        tmp_path: Path, isolated_autotune: Path, capsys: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "hostile.json"
    _hostile_export(path, tmp_path / "elsewhere")
    autotune.import_results(path)
    config = autotune.best_config("tiny_mlp", wait=False)
    assert config.source == "measured" and config.evidence is not None
    assert config.evidence.origin is not None and config.evidence.origin.startswith(
        "imported from hostile.json (exported 20")  # the file the user gave, not what the file says of itself
    assert "imported from hostile.json" in config.reason and "ACME" not in config.reason
    failure = next(r for r in config.evidence.rivals if r.failure is not None).failure
    assert failure is not None and failure.detail.startswith("[2J measured at ACME labs31m]0;owned")
    _unsaid(config.reason + config.model_dump_json())
    assert main(["--explain", "tiny_mlp"]) == 0
    assert main(["--family", "tiny_mlp"]) == 0  # the decisions table
    out, err = capsys.readouterr()
    assert "[2J measured at ACME labs31m]0;owned" in " ".join(out.split())  # said, but harmless
    _unsaid(out + err + caplog.text)


def test_a_shipped_files_origin_is_its_name_made_printable(tmp_path: Path, isolated_autotune: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    name = "vendor.json" if sys.platform == "win32" else "vendor\x1b[2J\r.json"  # Windows refuses such names
    shipped = tmp_path / name
    _hostile_export(shipped, tmp_path / "vendor")
    monkeypatch.setenv("AUTOTUNE_DEFAULTS", str(shipped))
    config = autotune.best_config("tiny_mlp", wait=False)
    said = "vendor.json" if sys.platform == "win32" else "vendor[2J .json"
    assert config.evidence is not None and config.evidence.origin == f"shipped in {said}"
    assert config.reason.endswith(f"shipped in {said}")
    _unsaid(config.reason + config.model_dump_json())
