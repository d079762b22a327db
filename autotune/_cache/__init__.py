"""Everything on disk: the store of measurements per machine configuration (``store``, its schema in
``schema``, atomic and no-follow file helpers in ``disk``, ``locks``), when a result is stale
(``freshness``), export / import and shipped defaults (``exchange``), this process's view and similar
machines (``lookup``); beside the results, the side files under one set of rules (``sidefiles``): the max-batch
answers (``batch_answers``), what training runs demoted (``demotions``), the DataLoader answers (``loader_answers``)
and what training loops saw of their time (``loops``). Nothing here times anything."""
