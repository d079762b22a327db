"""Everything on disk: the store of measurements per machine configuration (``store``, its schema in
``records``, atomic and no-follow file helpers in ``disk``, ``locks``), when a result is stale
(``freshness``), export / import and shipped defaults (``exchange``), this process's view and similar
machines (``lookup``), and the max-batch answers (``max_batch``). Nothing here times anything."""
