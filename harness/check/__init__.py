"""Checkers: pure functions over every rank's records; they never reach into a world."""
