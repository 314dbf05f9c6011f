"""Worlds: where the ranks live (threads of one process now; torchrun processes later)."""
