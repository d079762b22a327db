"""Calibration: everything that runs in the worker, one module per step of the pipeline.

``plan`` (what to measure) -> ``setup`` (build, verify against the fp32 CPU reference, warm up; with ``step``
and ``verify``; ``roster`` holds what is set up) -> ``session`` (pruning stages, then the final paired
comparison; timing by ``measure``, whose looks drop, outpace and settle by ``looks``) ->
``worker`` (the process around it all, speaking ``protocol``; started by ``launch``, early for ``python -m
autotune``), which hands the host a ``FamilyResult``.
Beside the pipeline, in the same worker: ``trace`` (a candidate under ``torch.profiler``), ``check`` (the
canary's re-timing) and ``memory`` (a candidate's peak memory at one batch size, for ``max_batch_size``).

It imports backends, families and the records, never the API, the store or the decision: it prunes, and
``autotune._decide`` picks from what it measured.
"""
