"""What the ranks run on: communication groups (and, later, streams and graphs)."""
