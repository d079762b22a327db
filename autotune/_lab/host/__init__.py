"""The host side of the worker, beside its child side (:mod:`autotune._lab`): the spawned worker a calibration
runs in (``worker``), its OS process and messages (``process``), its early start before the host imports torch
(``launch``), and the per-OS process handling (``_posix``, ``_windows``)."""
