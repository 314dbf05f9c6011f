import signal
import sys

from harness.cli import main
from harness.runtime.intra_op import one_intra_op_thread


class Terminated(KeyboardInterrupt):
    """SIGTERM (a CI timeout, `timeout`). A KeyboardInterrupt, so that it unwinds like
    Ctrl-C: Hypothesis lets it through instead of taking it for a failing example, and
    every world is closed by the code that opened it."""


def _terminate(signum, frame):
    raise Terminated()


signal.signal(signal.SIGTERM, _terminate)
one_intra_op_thread()
try:
    code = main()
except KeyboardInterrupt as stop:
    name = "SIGTERM" if isinstance(stop, Terminated) else "an interrupt"
    print(f"stopped by {name}; the worlds it started are closed", file=sys.stderr)
    code = 128 + (signal.SIGTERM if isinstance(stop, Terminated) else signal.SIGINT)
sys.exit(code)
