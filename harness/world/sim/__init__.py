"""The in-process world: N ranks as threads, each with a real gloo group."""
