"""Many processes of one job (torchrun, Lightning, Accelerate): each rank its own device, one answer for the job.

``launch`` reads where this process stands in a job (the launcher's variables, or torch.distributed's default
group); ``group`` is the job's own gloo group, with a long timeout of its own, over which the ranks exchange JSON;
``agree`` is the pure part (each rank's view of its machine's measurements, the job's choice on a rank's own
device, the digest every rank must share); ``job`` runs the exchange for ``best_config``. torch.distributed
coordinates: autotune adds no server.
"""
