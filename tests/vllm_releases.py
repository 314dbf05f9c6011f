"""What the vLLM tests need to know of the releases: which of them still ship the bugs a test
pins, and the project's patches written against each (scenarios/vllm/patches/, one folder a
release after 0.33.0), and configs and scenarios modelling the installed release."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from harness.config import HarnessConfig
from harness.scenario import Scenario
from harness.vllm_code.fixes import PATCHES, fix_path
from harness.vllm_code.source import VllmPatch, read_patch
from harness.vllm_sut.available import installed_release, vllm_version

# dp_utils' guard `2 * min < G` and ubatching.py (#55586's hang and crash) are the same in both.
SHIPS_THE_KNOWN_BUGS = ("0.33.0", "0.34.0")


def ships_the_known_bugs() -> bool:
    return vllm_version() in SHIPS_THE_KNOWN_BUGS


def release_patch(name: str) -> VllmPatch:
    """The patch `name` as written against the installed release (0.33.0's at the top)."""
    return read_patch(fix_path(name, vllm_version() or "") or PATCHES / name)  # none: says so


def config_of(**flat) -> HarnessConfig:
    """HarnessConfig.of(**flat) modelling the installed vLLM's release, as the command line
    does for every config that runs vLLM's code (harness.cli_vllm.vllm_fields)."""
    return HarnessConfig.of(**{"release": installed_release().value, **flat})


def on_installed(scenario: Scenario) -> Scenario:
    """The scenario modelling the installed vLLM's release (what `run --scenario` does)."""
    return replace(scenario, config=scenario.config.with_changes(
        release=installed_release().value))


def refused_by_vllm(folder: Path, **system: str) -> Path:
    """A scenario file, in `folder`, of a config vLLM refuses and HarnessConfig lets through
    (vLLM wants max_num_batched_tokens >= max_num_seqs; should the harness come to refuse it,
    exit 2, its tests need another); `system` says whose code runs (sut=, execution=)."""
    path = folder / "refused.json"
    path.write_text(json.dumps({
        "name": "refused-by-vllm",
        "config": {"dp_size": 2, **system, "release": installed_release().value,
                   "capture_sizes": [8, 16], "max_num_reqs": 1024,
                   "max_num_batched_tokens": 64},
        "steps": [{"ranks": [12, 16]}]}))
    return path
