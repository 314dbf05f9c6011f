import signal
import sys

from harness.cli import main
from harness.runtime.intra_op import one_intra_op_thread

# A driver stopped by SIGTERM (a CI timeout, `timeout`) unwinds like Ctrl-C, so every world it
# started is closed by the code that opened it.
signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
one_intra_op_thread()
sys.exit(main())
