"""The tools besides calibration, host side; each runs its job in a worker of its own: the canary (``--check``
re-times cached picks), and the largest batch that fits (``max_batch_size``)."""
