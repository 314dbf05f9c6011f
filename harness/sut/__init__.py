"""The system under test: vLLM's microbatched CUDA-graph decision logic in miniature, and the
rank code every world runs (capture, dispatch, replay, the one step loop)."""
