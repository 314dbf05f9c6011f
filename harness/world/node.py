"""`python -m harness.world.node`: one node of a multi-node world (the Makefile's and the
docs' command); the code is harness/world/multinode/node.py."""

import sys

from harness.world.multinode.node import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
