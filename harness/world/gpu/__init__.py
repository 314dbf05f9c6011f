"""The single-rank GPU world (a real NCCL group of size one, a World of one rank) and the
steps the GPU suite and `python -m harness.bench.gpu` check on it against the reference."""
