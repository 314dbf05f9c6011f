"""The patch applier and the handling of bad vLLM-code input, on a small fake tree: no vLLM
needed (these run in CI). The real patches are checked against their own old side."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness.cli import main
from harness.config import HarnessConfig
from harness.errors import ConfigError
from harness.scenario import scenario_from_dict
from harness.vllm_code.identity import git_commit
from harness.vllm_code.patch import MAX_OFFSET, PatchError, apply_file_patch, parse_diff
from harness.vllm_code.source import VllmPatch, content_hash, patched_files, read_patch
from harness.vllm_sut.available import unavailable_reason, vllm_version

ROOT = Path(__file__).resolve().parents[1]
PATCHES = ROOT / "scenarios" / "vllm" / "patches"
MODULE = "vllm/v1/worker/gpu/dp_utils.py"
FAKE = "".join(f"line {i}\n" for i in range(1, 21))


def diff(old_start: int, old: list[str], new: list[str], path: str = MODULE,
         context: tuple[list[str], list[str]] = ([], [])) -> str:
    before, after = context
    body = [f" {x}" for x in before] + [f"-{x}" for x in old] + [f"+{x}" for x in new] + \
        [f" {x}" for x in after]
    n_old = len(before) + len(old) + len(after)
    n_new = len(before) + len(new) + len(after)
    return (f"diff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n"
            f"@@ -{old_start},{n_old} +{old_start},{n_new} @@\n" + "\n".join(body) + "\n")


def fake_tree(tmp_path: Path, text: str = FAKE) -> Path:
    target = tmp_path / MODULE
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    return tmp_path


def as_patch(text: str, name: str = "fix.diff") -> VllmPatch:
    return VllmPatch(name, content_hash(text), text)


def test_a_hunk_whose_context_matches_replaces_exactly_its_lines(tmp_path):
    text = diff(4, ["line 5"], ["line five"], context=(["line 4"], ["line 6"]))
    out = patched_files(fake_tree(tmp_path), (as_patch(text),))[MODULE]
    assert out == FAKE.replace("line 5\n", "line five\n")
    assert (tmp_path / MODULE).read_text() == FAKE  # the tree itself is never written


def test_a_hunk_whose_lines_moved_a_little_applies_at_their_one_exact_match():
    patch = parse_diff(diff(2, ["line 10"], ["ten"], context=(["line 9"], [])))[0]
    assert apply_file_patch(FAKE, patch) == FAKE.replace("line 10\n", "ten\n")


LONG = "".join(f"line {i}\n" for i in range(1, 201))


@pytest.mark.parametrize("moved, applies", [(MAX_OFFSET, True), (MAX_OFFSET + 1, False)])
def test_a_hunk_applies_at_most_max_offset_lines_from_where_its_header_says(moved, applies):
    # The old lines are at line 100; the header puts them `moved` lines above.
    patch = parse_diff(diff(100 - moved, ["line 100"], ["hundred"]), "moved.diff")[0]
    if applies:
        assert apply_file_patch(LONG, patch, "moved.diff") == LONG.replace(
            "line 100\n", "hundred\n")
        return
    with pytest.raises(PatchError) as exc:
        apply_file_patch(LONG, patch, "moved.diff")
    assert str(exc.value) == (
        f"moved.diff: hunk 1 of {MODULE} (@@ -{100 - moved},1 +{100 - moved},1 @@) does not "
        f"apply where it says: its old lines are at line 100, {moved} lines from line "
        f"{100 - moved} (at most {MAX_OFFSET}); rebase the patch onto this tree")


TWICE = "".join(f"{x}\n" for x in ["a", "return x", "b", "c", "return x", "d"])


@pytest.mark.parametrize("stated", [2, 3])  # at one of the two places, or between them
def test_a_hunk_whose_old_lines_occur_twice_is_refused_naming_it_and_both_places(stated):
    patch = parse_diff(diff(stated, ["return x"], ["return y"]), "twice.diff")[0]
    with pytest.raises(PatchError) as exc:
        apply_file_patch(TWICE, patch, "twice.diff")
    assert str(exc.value) == (
        f"twice.diff: hunk 1 of {MODULE} (@@ -{stated},1 +{stated},1 @@) is ambiguous: its old "
        "lines match at 2 places (lines 2, 5); give it more context so they match once")


def test_context_that_makes_the_old_lines_unique_lets_the_hunk_apply():
    patch = parse_diff(diff(5, ["return x"], ["return y"], context=(["c"], [])))[0]
    assert apply_file_patch(TWICE, patch) == TWICE.replace("c\nreturn x", "c\nreturn y")


def test_an_ambiguous_hunk_in_a_patch_is_bad_input_naming_the_patch_and_file(tmp_path):
    text = diff(2, ["return x"], ["return y"])
    with pytest.raises(ConfigError, match=r"vllm_patch: twice.diff: hunk 1 of .*dp_utils.py "
                       r"\(@@ -2,1 \+2,1 @@\) is ambiguous"):
        patched_files(fake_tree(tmp_path, TWICE), (as_patch(text, "twice.diff"),))


def test_a_context_line_that_differs_is_refused_naming_the_hunk_and_the_line():
    patch = parse_diff(diff(4, ["line 5"], ["x"], context=(["line 4"], ["line SIX"])))[0]
    with pytest.raises(PatchError, match=r"hunk 1 of .*dp_utils.py .* line 6 is 'line 6', "
                       r"the hunk expects 'line SIX'"):
        apply_file_patch(FAKE, patch)


def test_whitespace_is_context_too():
    patch = parse_diff(diff(5, ["line 5 "], ["x"]))[0]
    with pytest.raises(PatchError, match="does not apply"):
        apply_file_patch(FAKE, patch)


def test_two_hunks_apply_in_order_with_the_first_shifting_the_second():
    text = diff(2, ["line 2"], ["a", "b", "c"]) + "".join(
        diff(10, ["line 10"], ["ten"]).splitlines(keepends=True)[3:])
    out = apply_file_patch(FAKE, parse_diff(text)[0])
    assert out.splitlines()[1:4] == ["a", "b", "c"] and out.splitlines()[11] == "ten"


def test_no_newline_at_end_of_file_is_honoured():
    text = (f"--- a/{MODULE}\n+++ b/{MODULE}\n@@ -20 +20 @@\n-line 20\n+last\n"
            "\\ No newline at end of file\n")
    assert apply_file_patch(FAKE, parse_diff(text)[0]).endswith("line 19\nlast")


@pytest.mark.parametrize("text, why", [
    ("just words\n", "holds no unified diff"),
    (f"--- a/{MODULE}\n+++ b/{MODULE}\n", "no hunk"),
    (f"--- /dev/null\n+++ b/{MODULE}\n@@ -0,0 +1 @@\n+x\n", "creates or deletes"),
    (f"--- a/{MODULE}\n+++ b/vllm/other.py\n@@ -1 +1 @@\n-a\n+b\n", "renames"),
    (f"--- a/{MODULE}\n+++ b/{MODULE}\n@@ -1,3 +1,3 @@\n-line 1\n+x\n", "cut short"),
    ("diff --git a/x b/x\nGIT binary patch\n", "no new, deleted, renamed or binary"),
])
def test_a_malformed_or_unsupported_diff_is_one_line_naming_why(text, why):
    with pytest.raises(PatchError, match=why) as exc:
        parse_diff(text)
    assert "\n" not in str(exc.value)


def test_a_patch_naming_a_file_the_tree_lacks_is_refused(tmp_path):
    text = diff(1, ["line 1"], ["x"], path="vllm/v1/worker/gpu/missing.py")
    with pytest.raises(ConfigError, match="names vllm/v1/worker/gpu/missing.py, which the "
                       "vllm at .* does not have"):
        patched_files(fake_tree(tmp_path), (as_patch(text),))


def test_a_patch_outside_the_vllm_package_is_refused(tmp_path):
    text = diff(1, ["line 1"], ["x"], path="tests/test_dp.py")
    with pytest.raises(ConfigError, match="only Python modules of the vllm package"):
        patched_files(fake_tree(tmp_path), (as_patch(text),))


def test_patches_apply_in_order_one_over_the_other(tmp_path):
    first = as_patch(diff(5, ["line 5"], ["five"]), "a.diff")
    second = as_patch(diff(5, ["five"], ["FIVE"]), "b.diff")
    out = patched_files(fake_tree(tmp_path), (first, second))[MODULE]
    assert "FIVE\n" in out
    with pytest.raises(ConfigError, match="b.diff: hunk 1"):
        patched_files(fake_tree(tmp_path), (second,))


@pytest.mark.parametrize("name", ["pr57020-inclusive.diff", "last-region-start.diff"])
def test_each_shipped_patch_applies_to_its_own_old_side_and_changes_the_guard(tmp_path, name):
    patch = read_patch(PATCHES / name)
    (file_patch,) = parse_diff(patch.diff)
    assert file_patch.path == MODULE and len(file_patch.hunks) == 1
    hunk = file_patch.hunks[0]
    filler = [f"# filler {i}\n" for i in range(hunk.old_start - 1)]
    out = patched_files(fake_tree(tmp_path, "".join(filler + list(hunk.old_lines))),
                        (patch,))[MODULE]
    old_guard = "2 * int(num_tokens_across_dp.min()) < ubatch_desc.num_tokens"
    assert old_guard in "".join(hunk.old_lines) and old_guard not in out
    want = ("2 * int(num_tokens_across_dp.min()) <= ubatch_desc.num_tokens"
            if name.startswith("pr57020") else "(ubatch_desc.num_tokens // num_ubatches) * (")
    assert want in out


def test_a_diff_whose_content_does_not_match_its_recorded_hash_is_refused():
    with pytest.raises(ConfigError, match="vllm_patches.diff: fix.diff: its content hashes"):
        VllmPatch("fix.diff", "0" * 64, "some diff\n")


def test_a_saved_scenario_records_the_patch_by_name_and_hash_and_the_wire_form_whole():
    text = diff(5, ["line 5"], ["five"])
    scenario = scenario_from_dict({
        "config": {"sut": "vllm", "vllm_patches": [as_patch(text).to_dict()]},
        "steps": [{"ranks": [4, 4]}]})
    saved = json.loads(scenario.to_json())["config"]["vllm_patches"]
    assert saved == [{"name": "fix.diff", "sha256": content_hash(text)}]
    wire = scenario.to_dict()["config"]["vllm_patches"][0]
    assert wire["diff"] == text  # what a torchrun rank receives
    again = scenario_from_dict(json.loads(scenario.to_json()))
    assert again.config.system.vllm_patches[0].sha256 == content_hash(text)
    assert not again.config.system.vllm_patches[0].resolved


def test_a_config_without_vllm_code_reads_as_before():
    assert not {"vllm_src", "vllm_patches", "differential_against_base"} & set(
        HarnessConfig().to_dict())


def test_differential_against_base_needs_patched_code():
    with pytest.raises(ConfigError, match="differential_against_base: needs patched"):
        HarnessConfig.of(sut="vllm", differential_against_base=True)


@pytest.mark.parametrize("argv, field", [
    (["decide", "--tokens", "2,4", "--vllm-patch", "x.diff"], "vllm_patch: names vLLM code"),
    (["exhaustive", "--vllm-src", "."], "vllm_src: names vLLM code"),
    (["fuzz", "--sut", "vllm", "--vllm-patch", "/nonexistent.diff"],
     "vllm_patch: /nonexistent.diff: No such file"),
    (["fuzz", "--vllm-patch", "x.diff"], "vllm_patch: names vLLM code; it needs --sut vllm"),
    (["decide", "--tokens", "2,4", "--sut", "vllm", "--vllm-src", "/nonexistent"],
     "vllm_src: /nonexistent is not a directory"),
    (["matrix", "--ks", "1"], "ks: holds 1"),
    (["fuzz", "--vllm-fix", "last-region-start.diff"], "vllm_fix: names vLLM code"),
])
def test_bad_vllm_code_flags_are_one_line_and_exit_2(capsys, argv, field):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert field in err and err.count("\n") == 1, err


def test_a_replay_without_the_recorded_patch_says_so_in_one_line(tmp_path, capsys):
    text = diff(5, ["line 5"], ["five"])
    path = tmp_path / "found.json"
    path.write_text(scenario_from_dict({
        "config": {"sut": "vllm", "vllm_patches": [as_patch(text).to_dict()]},
        "steps": [{"ranks": [4, 4]}]}).to_json())
    assert main(["run", "--scenario", str(path)]) == 2
    err = capsys.readouterr().err
    assert "found on vLLM patched with fix.diff" in err and err.count("\n") == 1, err


def test_a_checkout_names_its_git_commit_and_site_packages_none(tmp_path):
    (tmp_path / ".git" / "refs" / "heads").mkdir(parents=True)
    (tmp_path / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (tmp_path / ".git" / "refs" / "heads" / "main").write_text("ab" * 20 + "\n")
    assert git_commit(tmp_path) == "ab" * 20
    assert git_commit(tmp_path / "lib") is None  # parents are not searched


FAKE_MODULES = {
    "vllm/__init__.py": "__version__ = '0.0.fake'\n",
    "vllm/v1/__init__.py": "", "vllm/v1/worker/__init__.py": "",
    "vllm/v1/worker/gpu/__init__.py": "",
    "vllm/v1/worker/ubatch_utils.py": "def get_num_ubatches(c):\n    return 2\n",
    # Just the signatures that make it a known API (0.34's, harness/vllm_code/api.py).
    "vllm/v1/worker/gpu/cudagraph_utils.py":
        "from vllm.v1.worker.ubatch_utils import get_num_ubatches\n\n\n"
        "class CudaGraphManager:\n"
        "    def __init__(self, c, decode_query_lens, decode_request_sizes=None):\n"
        "        pass\n",
    MODULE: "from vllm.v1.worker.gpu.cudagraph_utils import get_num_ubatches\n\n\n"
            "def guard(low, g):\n    return 2 * low < g\n\n\n"
            "def dispatch_cg_and_sync_dp(manager, allow_skip_drafts=False):\n    pass\n\n\n"
            "from dataclasses import dataclass\n\n\n@dataclass\nclass DPSyncState:\n"
            "    max_query_len: int\n    skip_drafts: bool\n",
}


def test_patched_decision_modules_are_private_copies_and_the_installed_ones_stay(tmp_path):
    # In a child process: the fake vllm goes on its path, which this process must not see.
    for rel, text in FAKE_MODULES.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    patch_text = diff(5, ["    return 2 * low < g"], ["    return 2 * low <= g"])
    (tmp_path / "fix.diff").write_text(patch_text)
    program = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        from harness.vllm_code.source import read_patch
        from harness.vllm_sut.code import CodeKey, code_for
        import vllm.v1.worker.gpu.dp_utils as installed
        patched = code_for(CodeKey(None, (read_patch({str(tmp_path / 'fix.diff')!r}),)))
        import vllm.v1.worker.gpu as pkg
        print(installed.guard(2, 4), patched.dp_utils.guard(2, 4),
              sys.modules["vllm.v1.worker.gpu.dp_utils"] is installed, pkg.dp_utils is installed,
              patched.dp_utils is not installed, patched.identity.describe())
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # the fake tree is the only vllm it sees
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                         cwd=ROOT, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[:5] == ["False", "True", "True", "True", "True"], out.stdout
    assert "patched with fix.diff" in out.stdout


# A fix's name resolves against the release of the vLLM it fixes: these need one installed.
needs_vllm = pytest.mark.skipif(vllm_version() is None, reason=unavailable_reason())


@needs_vllm
def test_an_unknown_fix_name_is_one_line_naming_vllm_fix_and_exit_2(capsys):
    assert main(["fuzz", "--sut", "vllm", "--vllm-fix", "nope.diff"]) == 2
    err = capsys.readouterr().err
    assert "vllm_fix: no fix 'nope.diff' for" in err and err.count("\n") == 1, err


@needs_vllm
def test_a_known_fix_named_on_the_command_line_is_the_file_for_the_installed_release():
    import argparse

    from harness.cli_vllm import add_vllm_flags, vllm_fields
    from harness.vllm_code.fixes import fix_path
    from harness.vllm_sut.available import installed_release

    parser = argparse.ArgumentParser()
    add_vllm_flags(parser)
    args = parser.parse_args(["--sut", "vllm", "--vllm-fix", "last-region-start.diff"])
    patches = vllm_fields(args)["vllm_patches"]
    release = installed_release().value
    assert patches == (read_patch(fix_path("last-region-start.diff", release)),)
