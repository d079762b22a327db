"""``autotune.trace``: the picked configuration's training step under ``torch.profiler``, host side (the step
runs in a worker of its own: ``autotune._lab.trace``)."""

from __future__ import annotations

import datetime as dt
import logging
import re
import sys
from pathlib import Path

from autotune._answer import answer, cached_families
from autotune._apply import fp32 as _fp32
from autotune._calibrate import new_worker
from autotune._errors import ConfigurationError
from autotune._families import get_family
from autotune._lab.protocol import TraceJob
from autotune._reports import TraceReport

log = logging.getLogger("autotune")


def trace(model_kind: str, *, out_dir: str | Path = ".", candidate: str | None = None) -> TraceReport:
    """Profile ``model_kind``'s picked configuration (calibrating on a miss) for a few training steps.

    ``candidate`` names another measured candidate by its label instead, e.g. ``"cpu fp32"``. The step runs
    in a fresh worker under ``torch.profiler`` (warm-up steps outside the trace, CPU and device activity); a
    Chrome trace is written under ``out_dir`` (open it in https://ui.perfetto.dev or ``chrome://tracing``)
    and the report lists the operators with the most self time per step.
    """
    family = get_family(model_kind)
    config = answer(family)
    chosen, init_scale = config.candidate, config.init_scale
    if candidate is not None:
        measured = cached_families([model_kind]).get(model_kind)
        results = {r.candidate.label: r for r in (measured.candidates if measured is not None else [])}
        if candidate not in results:
            raise ConfigurationError("candidate", candidate, f"a candidate measured for {model_kind}: "
                                     + ", ".join(results))
        chosen = results[candidate].candidate
        numerics = results[candidate].numerics
        init_scale = numerics.init_scale if numerics is not None else None
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    slug = re.sub(r"[^A-Za-z0-9.-]+", "-", chosen.label)
    path = Path(out_dir).expanduser().resolve() / f"trace-{model_kind}-{slug}-{stamp}.json"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigurationError("out_dir", str(out_dir), f"a directory this user can write ({exc})") from exc
    log.info("tracing %s on %s into %s", model_kind, chosen.label, path)
    job = TraceJob(family=family, candidate=chosen, init_scale=init_scale,
                   path=str(path), fp32=_fp32.current(), sys_path=[p for p in sys.path if p])
    with new_worker() as worker:
        return worker.run_trace(job)


__all__ = ["trace"]
