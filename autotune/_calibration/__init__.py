"""What runs in the worker child, one module per step of the pipeline.

``plan`` (what to measure) -> ``prepare`` (build, verify against the fp32 CPU reference with ``verify``,
``probe`` a slow precision, warm up; ``step`` is one training step; ``roster`` holds what is prepared) ->
``session`` (pruning stages, then the final paired comparison; rounds timed by ``measure``, each look judged by
``looks``), all driven by ``child`` over the typed messages of ``protocol``; ``entry`` runs ``child`` once the
worker is tied to its host's life. Beside the pipeline: ``check`` (re-timing a cached pick), ``memory`` (peak
memory at one batch size), ``trace`` (a step under the profiler), and ``simulate`` (truth profiles on a fake
clock, which drive the same session in tests and benchmarks).

It imports backends, families and the records, never the API, the cache or the decision: it prunes, and
``autotune._decide`` picks from what it measured.
"""
