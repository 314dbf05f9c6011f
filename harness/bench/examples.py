"""The decode-sized examples the CPU benches feed their worlds: one config, and the 2-rank
one-step scenarios of `make bench`'s throughput table (`rank_step` and `floor` reuse them)."""

from __future__ import annotations

import random

from harness.scenario import Scenario, scenario_from_dict

CONFIG = {"capture_sizes": [16, 32, 64], "max_num_reqs": 64, "max_num_batched_tokens": 64,
          "decode_threshold": 8, "prefill_threshold": 32}


def decode_examples(count: int, seed: int = 0) -> list[Scenario]:
    """Decode-sized one-step examples: every rank 1..64 single-token requests."""
    rng = random.Random(seed)
    return [scenario_from_dict({"name": f"bench-{i}", "config": CONFIG,
                                "steps": [{"ranks": [rng.randint(1, 64), rng.randint(1, 64)]}]})
            for i in range(count)]
