"""What runs in the worker child, one module per step of the pipeline.

``plan`` (what to measure) -> ``prepare`` (build, verify against the fp32 CPU reference with ``verify``,
``probe`` a slow precision, warm up; ``step`` is one training step; ``roster`` holds what is prepared) ->
``session`` (pruning stages, then the final paired comparison; rounds timed by ``measure``, each look judged by
``looks``, a busy machine told by ``load``: what the operating system says, the pause before each control), all
driven by ``child`` over the typed messages of ``protocol``; ``entry`` runs ``child`` once the worker is tied to
its host's life, and ``copies`` the copies of the timed step that stand for a job's other processes on the
machine. Beside the pipeline: ``check`` (re-timing a cached pick for the canary, ``--check``), ``max_batch``
(peak memory at one batch size), ``trace`` (a step under the profiler). The host side of the worker process
lives beside the child in ``host``; truth profiles (:mod:`autotune.testing.truth`) drive the same session on a
fake clock in :mod:`autotune.testing.simulate`.

The child imports backends, families and the records, never ``host``, the API, the cache or the decision: it
prunes, and ``autotune._decide`` picks from what it measured. Only ``host`` takes the cache's locks.
"""
