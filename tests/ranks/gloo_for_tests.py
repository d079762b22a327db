"""A job's ranks in this process: one thread per rank over a real gloo group on loopback.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable, Sequence

import torch.distributed as dist

from autotune._ranks.group import JobGroup
from autotune._ranks.launch import Launch


def in_ranks(nodes: Sequence[str], act: Callable[[JobGroup], object], *, timeout_s: float = 60.0,
             loop_timeout_s: float = 30.0) -> list[object]:
    """``act`` on each rank of a job whose rank ``i`` runs on machine ``nodes[i]``, one thread per rank, over a real
    gloo group on loopback: what each returned, or the exception it raised."""
    store = dist.HashStore()
    results: list[object] = [None] * len(nodes)

    def rank(index: int) -> None:
        launch = Launch(rank=index, world_size=len(nodes), local_rank=list(nodes[:index]).count(nodes[index]),
                        node=nodes[index])
        try:
            group = dist.ProcessGroupGloo(dist.PrefixStore("job/", store), index, len(nodes),
                                          dt.timedelta(seconds=timeout_s))
            results[index] = act(JobGroup(launch, group, timeout_s, loop_timeout_s=loop_timeout_s))
        except Exception as exc:
            results[index] = exc

    threads = [threading.Thread(target=rank, args=(index,)) for index in range(len(nodes))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=4 * timeout_s)
    assert not any(thread.is_alive() for thread in threads)
    return results
