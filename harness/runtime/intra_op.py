"""How many threads torch's intra-op pool gets in the harness's own processes."""

from __future__ import annotations

import torch


def one_intra_op_thread() -> None:
    """The harness's tensors are tiny, so torch's intra-op pool only contends with the ranks
    for the same cores: on a loaded 2-core machine the driver's reference ran 20x slower with
    the default pool (767 ms against 36 ms per sim example). Workers get OMP_NUM_THREADS=1."""
    if torch.get_num_threads() != 1:
        torch.set_num_threads(1)
