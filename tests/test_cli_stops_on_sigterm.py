"""A fuzz run stopped by SIGTERM (a CI timeout) stops at once with one line and exit 143,
and leaves no process behind: it is not a failing example for Hypothesis to shrink."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]


def test_sigterm_mid_search_ends_the_run_in_one_line_and_exit_143(tmp_path):
    log = tmp_path / "log.jsonl"
    driver = subprocess.Popen(
        [sys.executable, "-m", "harness", "fuzz", "--variant", "reference", "--nproc", "2",
         "--seconds", "300", "--no-database", "--log", str(log),
         "--found-dir", str(tmp_path / "found")],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (log.exists() and log.read_text().strip()):
            assert driver.poll() is None, driver.communicate()
            time.sleep(0.1)  # the search is under way once an example was logged
        children = psutil.Process(driver.pid).children(recursive=True)
        assert children  # the sandbox's processes
        driver.send_signal(signal.SIGTERM)
        out, err = driver.communicate(timeout=30)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert driver.returncode == 128 + signal.SIGTERM, err
    assert err.strip().splitlines()[-1] == ("stopped by SIGTERM; the worlds it started are "
                                            "closed")
    assert "Traceback" not in err
    psutil.wait_procs(children, timeout=10)
    assert not [c.pid for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]


GC_CALLBACK_SIGTERM = """
import gc, os, signal, sys, time
from harness.termination import stop_on_sigterm
stop_on_sigterm()
def callback(phase, info):
    if phase == "start":
        gc.callbacks.remove(callback)
        os.kill(os.getpid(), signal.SIGTERM)
        sum(range(10000))  # the handler runs here, inside the callback
gc.callbacks.append(callback)
try:
    gc.collect()
    time.sleep(5)
    print("still running")
except KeyboardInterrupt as stop:
    print("stopped by", type(stop).__name__)
"""


def test_a_sigterm_that_lands_in_a_gc_callback_still_stops_the_run():
    done = subprocess.run([sys.executable, "-c", GC_CALLBACK_SIGTERM], cwd=ROOT,
                          capture_output=True, text=True, timeout=30)
    assert done.stdout.strip() == "stopped by Terminated", done.stderr
