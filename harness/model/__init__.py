"""The miniature MoE model every rank runs, and the single-process reference it must match."""
