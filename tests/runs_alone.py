"""A world's one-scenario run that remembers what it was asked to run (the rerun-alone
callback of harness/check/stream.py, watched by tests)."""


class RunsAlone:
    def __init__(self, world) -> None:
        self.world, self.asked = world, []

    def __call__(self, scenario):
        self.asked.append(scenario)
        return self.world.run(scenario)
