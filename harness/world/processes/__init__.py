"""Processes of a world: started with the package on their path, signalled and reaped within
bounds, tied to the process they serve, and kept clear of the cyclic collector in a step."""
