import sys

from harness.cli import main
from harness.runtime.intra_op import one_intra_op_thread

one_intra_op_thread()
sys.exit(main())
