"""autotune: pick the fastest *correct* device and precision for PyTorch training, by measuring here.

>>> import autotune
>>> cfg = autotune.best_config("cnn")      # measured once per machine, then instant from the cache
>>> cfg.device, cfg.precision               # e.g. ('cpu', 'bf16-mixed')
"""

from __future__ import annotations

import warnings

# Without numpy installed, importing torch warns "Failed to initialize NumPy"; autotune needs no numpy and
# its users should not see that warning because of us.
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy", category=UserWarning)
    import torch  # noqa: F401

from autotune._api import best_config, clear_cache, export_results, import_results, trace
from autotune._background import CalibrationJob, start_calibration
from autotune._calibrate import CalibrationProgress, CalibrationReport, calibrate
from autotune._config import Config
from autotune._errors import (
    AutotuneError,
    BatchSizeUnsupportedError,
    CalibrationCancelled,
    CalibrationError,
    CalibrationPending,
    ConfigurationError,
    FamilyRegistrationError,
    FrameworkError,
    ImportFileError,
    MaxBatchError,
    TraceError,
    UnknownFamilyError,
)
from autotune._exchange import use_defaults
from autotune._families import Family, Workload, get_family, register_family
from autotune._fingerprint import Fingerprint, fingerprint
from autotune._max_batch import max_batch_report, max_batch_size
from autotune._reports import MaxBatchReport, MemoryLine, MemoryProbe, OperatorTime, TraceReport
from autotune._version import __version__

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
    "ConfigurationError",
    "Family",
    "FamilyRegistrationError",
    "Fingerprint",
    "FrameworkError",
    "ImportFileError",
    "MaxBatchError",
    "MaxBatchReport",
    "MemoryLine",
    "MemoryProbe",
    "OperatorTime",
    "TraceError",
    "TraceReport",
    "UnknownFamilyError",
    "Workload",
    "__version__",
    "best_config",
    "calibrate",
    "clear_cache",
    "export_results",
    "fingerprint",
    "get_family",
    "import_results",
    "max_batch_report",
    "max_batch_size",
    "register_family",
    "start_calibration",
    "trace",
    "use_defaults",
]
