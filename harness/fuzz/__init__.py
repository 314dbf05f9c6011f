"""The fuzzer: named bug variants, a budgeted Hypothesis search over DP skew on a world, and
the run log every example and finding is written to."""
