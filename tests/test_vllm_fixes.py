"""The project's fixes of known vLLM bugs are named once and resolved for the release tested
(harness/vllm_code/fixes.py): the rebased file where the release moved the code, else the one
written against 0.33.0, else none."""

from __future__ import annotations

from harness.vllm_code.fixes import PATCHES, fix_names, fix_path, releases_fixed


def test_a_fix_rebased_for_a_release_is_the_one_that_release_gets():
    guard = "last-region-start.diff"
    assert fix_path(guard, "0.34") == PATCHES / "0.34" / guard
    assert fix_path(guard, "0.34.0") == fix_path(guard, "0.34")


def test_a_release_without_a_rebased_file_gets_the_one_written_against_0_33():
    assert fix_path("last-region-start.diff", "0.33") == PATCHES / "last-region-start.diff"
    assert fix_path("pr57020-inclusive.diff", "0.34") == PATCHES / "pr57020-inclusive.diff"


def test_a_fix_of_a_newer_releases_code_is_none_for_an_older_one():
    assert fix_path("verify-slices-by-device-layout.diff", "0.33") is None
    assert fix_path("no-such-fix.diff", "0.34") is None
    assert {"last-region-start.diff", "verify-slices-by-device-layout.diff"} <= set(fix_names())


def test_a_fix_says_which_releases_it_is_written_for():
    assert releases_fixed("verify-slices-by-device-layout.diff") == ["0.34"]
    assert releases_fixed("last-region-start.diff") == ["0.33", "0.34"]
    assert releases_fixed("no-such-fix.diff") == []
