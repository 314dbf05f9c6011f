"""`python -m harness.bench`: the throughput and detection tables of `make bench`."""

import sys

from harness.bench.throughput import main

sys.exit(main())
