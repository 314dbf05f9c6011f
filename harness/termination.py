"""SIGTERM (a CI timeout, `timeout`) as an exception that unwinds the run like Ctrl-C."""

import os
import signal
import sys
import threading


class Terminated(KeyboardInterrupt):
    """A KeyboardInterrupt, so that it unwinds like Ctrl-C: Hypothesis lets it through
    instead of taking it for a failing example, and every world is closed by the code that
    opened it."""


def _terminate(signum, frame):
    raise Terminated()


def _report_unraisable(args, default=sys.unraisablehook):
    # A signal that lands while a gc callback runs (Hypothesis has one) raises there, and the
    # interpreter drops that exception: send it again from a thread, to land outside it.
    if isinstance(args.exc_value, Terminated):
        again = threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGTERM))
        again.daemon = True
        again.start()
        return
    default(args)


def stop_on_sigterm() -> None:
    """From now on SIGTERM raises Terminated in the main thread, also when it first lands in
    a gc callback."""
    signal.signal(signal.SIGTERM, _terminate)
    sys.unraisablehook = _report_unraisable
