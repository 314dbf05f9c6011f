"""A distributed test harness and correctness simulator for microbatched (DBO) CUDA-graph steps."""
