"""Benchmarks that print tables of ratios measured side by side: `throughput` and
`detection` (`make bench`), `gpu` and `gpu_dp` (`make bench-gpu`); `floor` is the bare
collectives of a step, run under torchrun by `throughput`."""
