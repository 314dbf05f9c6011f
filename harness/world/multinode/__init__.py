"""The torchrun world over several nodes on torchrun's c10d rendezvous: the rig of agents
that outlive their worlds, the node command, and a loopback layout for one machine."""
