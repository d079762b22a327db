"""What a Config means to torch, applied the same way in the timed step, the guard's replay and the app's process:
the fp32 / tf32 process settings (``fp32``), what a mixed precision means (``precision``: the autocast dtype, the
GradScaler default) and the variant axes (``axes``: layout, optimizer, threads, compilation, the batch copy)."""
