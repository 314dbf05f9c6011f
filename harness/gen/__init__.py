"""Generators: Hypothesis strategies of configs, DP skew shapes and scenarios. They know
nothing of worlds or checkers."""
