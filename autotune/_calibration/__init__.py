"""Calibration: everything that runs in the worker, one module per step of the pipeline.

``plan`` (what to measure) -> ``setup`` (build, verify against the fp32 CPU reference, warm up; with ``step``
and ``verify``) -> ``session`` (pruning stages, then the final paired comparison; timing by ``measure``) ->
``worker`` (the process around it all, speaking ``protocol``), which hands the host a ``FamilyResult``.

It imports backends, families and the records, never the API, the store or the decision: it prunes, and
``autotune._decide`` picks from what it measured.
"""
