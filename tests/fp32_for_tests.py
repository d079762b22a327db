"""torch's per-backend fp32 settings, read as a whole: what the fp32 tests of both tiers compare."""

from __future__ import annotations

import torch

B = torch.backends


#: every setting torch's per-backend API exposes here, parents included
NODES = {
    "generic": B, "cudnn": B.cudnn, "mkldnn": B.mkldnn, "cuda.matmul": B.cuda.matmul, "cudnn.conv": B.cudnn.conv,
    "cudnn.rnn": B.cudnn.rnn, "mkldnn.matmul": B.mkldnn.matmul, "mkldnn.conv": B.mkldnn.conv,
    "mkldnn.rnn": B.mkldnn.rnn,
}


def fp32_state() -> dict[str, str]:
    """Each setting's ``fp32_precision``, by name."""
    return {name: node.fp32_precision for name, node in NODES.items()}
