"""Everything on disk: the store of measurements per machine configuration (``store``, its schema in
``records``, atomic and no-follow file helpers in ``disk``, ``locks``), when a result is stale
(``freshness``), export / import and shipped defaults (``exchange``), this process's view and similar
machines (``lookup``), the max-batch answers (``max_batch``) and what training runs demoted (``demotions``).
Nothing here times anything."""
