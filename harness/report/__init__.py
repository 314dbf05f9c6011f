"""The report of a fuzz run, from its run log (`harness/fuzz/run_log.py`).

    logs.py          read the logs; every scenario parsed once, bad input as a ConfigError
    outcome.py       whether a finding passes: the reference must stay clean, a bug be found
    junit.py         JUnit XML for CI: a suite per variant, a test case per finding
    verdicts.py      every verdict of every example as JSON, plus the findings
    markdown.py      the summary a person reads: findings, failing checkers, replay commands
    decision_map.py  per config, a PNG of rank 0's decision over (min, max) tokens per rank
    build.py         all of the above into one directory
    command.py       `python -m harness report`
"""
