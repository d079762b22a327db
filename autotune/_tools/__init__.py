"""The tools besides calibration, host side: ``check`` (the canary: ``--check`` re-times cached picks), ``trace``, the
largest batch that fits (``max_batch_size``), each in a worker of its own; and the DataLoader settings measured in
the loop as the user runs it (``cfg.dataloader_kwargs``), in the calling process."""
