"""The system under test: vLLM's microbatched CUDA-graph decision logic, in miniature."""
