"""The vLLM releases the harness knows, newest last (docs/vllm.md §9)."""

import enum


class Release(enum.Enum):
    """Which vLLM release's DBO the miniature models (docs/spec.md §2.6), and which release's
    API a vLLM tree has (harness/vllm_code/api.py)."""

    V0_33 = "0.33"  # one token-keyed table for every batch
    V0_34 = "0.34"  # decode graphs keyed by request count, looked up first

    @property
    def request_keyed_decode(self) -> bool:
        return self is Release.V0_34

    @property
    def request_boundary_split(self) -> bool:
        """0.34 splits a uniform batch of multi-token queries between requests (§4.1)."""
        return self is Release.V0_34

    @property
    def spec_decode_with_dbo(self) -> bool:
        """0.34 lets speculative decoding run microbatched; 0.33 refuses it (§1.6)."""
        return self is Release.V0_34

    @property
    def dead_dp_ranks(self) -> bool:
        """0.34's DP sync leaves dead ranks' columns out under fault tolerance (§1.7)."""
        return self is Release.V0_34
