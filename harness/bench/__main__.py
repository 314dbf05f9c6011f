"""`python -m harness.bench`: the throughput and detection tables of `make bench`."""

import sys

from harness.bench.throughput import main
from harness.runtime.intra_op import one_intra_op_thread

one_intra_op_thread()
sys.exit(main())
