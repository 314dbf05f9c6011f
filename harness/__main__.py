import signal
import sys

from harness.cli import main
from harness.runtime.intra_op import one_intra_op_thread
from harness.termination import Terminated, stop_on_sigterm

stop_on_sigterm()
one_intra_op_thread()
try:
    code = main()
except KeyboardInterrupt as stop:
    name = "SIGTERM" if isinstance(stop, Terminated) else "an interrupt"
    print(f"stopped by {name}; the worlds it started are closed", file=sys.stderr)
    code = 128 + (signal.SIGTERM if isinstance(stop, Terminated) else signal.SIGINT)
sys.exit(code)
