"""Fuzz campaigns: several fuzz jobs sharing one example database (a local Redis server when
none is given), their run logs merged into one report."""
