"""The torchrun world: persistent rank processes launched by torchrun, fed by this driver;
the rig that brings them up on one node, the workers, batches and evidence."""
