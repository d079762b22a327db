"""The framework adapters: a decision in Lightning's words (``lightning``) and Accelerate's (``accelerate``), and the
guard as a Lightning callback (``callback``, which alone imports Lightning, when it loads). ``Config`` loads them
only when a method of it asks, so a warm ``best_config`` carries none."""
