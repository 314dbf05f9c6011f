"""What the ranks run on: bounded collectives, streams, graph backends, the device fence,
and the microbatch thread ring with the overlap interface the model talks to."""
