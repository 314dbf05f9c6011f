"""The rank code on one GPU: the single-rank GPU world (a real NCCL group of size one), its
config, and the steps the GPU suite and `python -m harness.bench.gpu` run on it."""
