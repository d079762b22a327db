"""autotune: pick the fastest *correct* device and precision for PyTorch training, by measuring here.

>>> import autotune
>>> cfg = autotune.best_config("cnn")      # measured once per machine, then instant from the cache
>>> cfg.device, cfg.precision               # e.g. ('cpu', 'bf16-mixed')
"""

from __future__ import annotations

import importlib as _importlib
import sys as _sys
import warnings as _warnings
from typing import TYPE_CHECKING

from autotune._version import __version__


def _quiet_numpy() -> None:
    """Without numpy installed, importing torch warns "Failed to initialize NumPy"; autotune needs no numpy and
    its users should not see that warning because of us: only that message, only from torch's modules. Set
    at import and again before a public name loads torch (a ``catch_warnings`` block may have dropped it)."""
    _warnings.filterwarnings("ignore", message="Failed to initialize NumPy", category=UserWarning, module="torch")


_quiet_numpy()

# The public names load on first use (PEP 562): ``python -m autotune`` starts its calibration worker before
# anything here imports torch, so the two imports overlap (``autotune._lab.host.launch``).
_WHERE = {
    "best_config": "_config",
    "freeze_support": "_lab.entry", "set_worker_python": "_lab.entry",
    "clear_cache": "_cache.lookup", "export_results": "_cache.lookup", "import_results": "_cache.lookup",
    "trace": "_tools.trace",
    "CalibrationJob": "_background", "start_calibration": "_background",
    "CalibrationProgress": "_calibrate", "CalibrationReport": "_background", "calibrate": "_background",
    "Config": "_config",
    **dict.fromkeys([
        "AutotuneError", "BatchSizeUnsupportedError", "CalibrationCancelled", "CalibrationError",
        "CalibrationPending", "ConfigMisbehaved", "ConfigurationError", "DatasetError", "FamilyRegistrationError",
        "FrameworkError",
        "ImportFileError", "MaxBatchError", "RanksError", "TraceError", "UnknownFamilyError", "WorkerStartError",
    ], "_errors"),
    "use_defaults": "_cache.exchange",
    "Family": "_families", "Workload": "_families", "get_family": "_families", "register_family": "_families",
    "Fingerprint": "_fingerprint", "fingerprint": "_fingerprint",
    "Guard": "_guard.watch",
    # Loads Lightning: reachable as autotune.GuardCallback, left out of __all__ so that `from autotune import *`
    # never needs a framework the app may not have.
    "GuardCallback": "_frameworks.callback",
    "max_batch_report": "_tools.max_batch", "max_batch_size": "_tools.max_batch",
    "Evidence": "_records", "Rival": "_records",
    **dict.fromkeys(["LoaderReport", "LoaderTrial", "LoopSummary", "MaxBatchReport", "MemoryLine", "MemoryProbe",
                     "OperatorTime", "TraceReport"], "_reports"),
}


if TYPE_CHECKING:
    from autotune._background import CalibrationJob, CalibrationReport, calibrate, start_calibration
    from autotune._cache.exchange import use_defaults
    from autotune._cache.lookup import clear_cache, export_results, import_results
    from autotune._calibrate import CalibrationProgress
    from autotune._config import Config, best_config
    from autotune._errors import (
        AutotuneError,
        BatchSizeUnsupportedError,
        CalibrationCancelled,
        CalibrationError,
        CalibrationPending,
        ConfigMisbehaved,
        ConfigurationError,
        DatasetError,
        FamilyRegistrationError,
        FrameworkError,
        ImportFileError,
        MaxBatchError,
        RanksError,
        TraceError,
        UnknownFamilyError,
        WorkerStartError,
    )
    from autotune._families import Family, Workload, get_family, register_family
    from autotune._fingerprint import Fingerprint, fingerprint
    from autotune._frameworks.callback import (
        GuardCallback as GuardCallback,  # re-exported; not in __all__: it loads Lightning
    )
    from autotune._guard.watch import Guard
    from autotune._lab.entry import freeze_support, set_worker_python
    from autotune._records import Evidence, Rival
    from autotune._reports import (
        LoaderReport,
        LoaderTrial,
        LoopSummary,
        MaxBatchReport,
        MemoryLine,
        MemoryProbe,
        OperatorTime,
        TraceReport,
    )
    from autotune._tools.max_batch import max_batch_report, max_batch_size
    from autotune._tools.trace import trace
else:  # type checkers see the imports above: a misspelt name stays an error there

    def __getattr__(name: str) -> object:
        module = _WHERE.get(name)
        if module is None:
            raise AttributeError(f"module 'autotune' has no attribute {name!r}")
        if name != "freeze_support" and _sys.argv[1:2] == ["--autotune-worker"]:  # _lab.entry.WORKER_FLAG
            # A frozen app started as autotune's worker that did not call freeze_support exits here, saying why.
            _importlib.import_module("autotune._lab.entry").not_a_worker()
        _quiet_numpy()
        value = getattr(_importlib.import_module(f"autotune.{module}"), name)
        globals()[name] = value  # once: later lookups do not come here
        return value

    def __dir__() -> list[str]:
        return sorted(set(globals()) | set(__all__))


__all__ = [
    "AutotuneError",
    "BatchSizeUnsupportedError",
    "CalibrationCancelled",
    "CalibrationError",
    "CalibrationJob",
    "CalibrationPending",
    "CalibrationProgress",
    "CalibrationReport",
    "Config",
    "ConfigMisbehaved",
    "ConfigurationError",
    "DatasetError",
    "Evidence",
    "Family",
    "FamilyRegistrationError",
    "Fingerprint",
    "FrameworkError",
    "Guard",
    "ImportFileError",
    "LoaderReport",
    "LoaderTrial",
    "LoopSummary",
    "MaxBatchError",
    "MaxBatchReport",
    "MemoryLine",
    "MemoryProbe",
    "OperatorTime",
    "RanksError",
    "Rival",
    "TraceError",
    "TraceReport",
    "UnknownFamilyError",
    "WorkerStartError",
    "Workload",
    "__version__",
    "best_config",
    "calibrate",
    "clear_cache",
    "export_results",
    "fingerprint",
    "freeze_support",
    "get_family",
    "import_results",
    "max_batch_report",
    "max_batch_size",
    "register_family",
    "set_worker_python",
    "start_calibration",
    "trace",
    "use_defaults",
]
