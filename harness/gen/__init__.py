"""Generators: Hypothesis strategies (and, later, exhaustive enumeration) of scenarios."""
