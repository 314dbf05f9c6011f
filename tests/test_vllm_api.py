"""Which vLLM API a tree has (harness/vllm_code/api.py), and what happens when it has none the
harness knows. The detection runs on fake module trees everywhere; the end-to-end tests run
on the installed vLLM and skip, with the reason, where none imports."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.config import HarnessConfig, Release
from harness.errors import ConfigError, HarnessCannot
from harness.vllm_code.api import MARKS, detect_api, missing_marks
from harness.vllm_sut.available import unavailable_reason, vllm_version

ROOT = Path(__file__).resolve().parent.parent
CGU, DPU, RUN = ("vllm.v1.worker.gpu.cudagraph_utils", "vllm.v1.worker.gpu.dp_utils",
                 "vllm.v1.worker.gpu.ubatch_utils")


def _tree(manager_params: str, state_fields: tuple[str, ...], prepare_params: str | None,
          slices_params: str = "input_batch, num_ubatches") -> dict:
    """Module stand-ins carrying just the signatures the marks look at."""
    namespace: dict = {}
    exec(f"class Manager:\n    def __init__(self, vllm_config, {manager_params}): pass\n"
         "def dispatch_cg_and_sync_dp(manager, num_tokens, allow_skip_drafts=False): pass\n"
         f"def create_ubatch_slices({slices_params}): pass\n"
         f"class Runner:\n    def prepare(self, input_batch, {prepare_params or 'x'}): pass\n",
         namespace)
    state = dataclasses.make_dataclass("DPSyncState", state_fields)
    modules = {CGU: SimpleNamespace(CudaGraphManager=namespace["Manager"]),
               DPU: SimpleNamespace(DPSyncState=state,
                                    dispatch_cg_and_sync_dp=namespace["dispatch_cg_and_sync_dp"])}
    if prepare_params is not None:
        modules[RUN] = SimpleNamespace(UBatchRunner=namespace["Runner"],
                                       create_ubatch_slices=namespace["create_ubatch_slices"])
    return modules


V0_33_TREE = _tree("device, cg_mode, decode_query_len, varlen_decode=False",
                   ("num_tokens_across_dp", "skip_drafts"), "block_tables, cg_mode=None")
V0_34_TREE = _tree("device, cg_mode, decode_query_lens, decode_request_sizes=None",
                   ("num_tokens_across_dp", "max_query_len", "skip_drafts"),
                   "block_tables, batch_desc, dp_sync_state=None",
                   "input_batch, num_ubatches, uniform_token_count=None")


def test_a_0_33_shaped_tree_is_driven_as_0_33():
    assert detect_api(V0_33_TREE, "0.33.0") is Release.V0_33


def test_a_0_34_shaped_tree_is_driven_as_0_34_whatever_its_version_says():
    assert detect_api(V0_34_TREE, "0.35.0.dev12+gabc") is Release.V0_34


def test_a_tree_without_the_execution_module_is_recognised_by_its_decision_code():
    older = {k: v for k, v in V0_34_TREE.items() if k != RUN}
    assert detect_api(older, "0.34.0") is Release.V0_34


def test_an_unknown_api_stops_naming_the_version_and_every_missing_mark():
    # 0.34 but for a runner whose prepare no longer takes the DP sync state.
    mixed = dict(V0_34_TREE, **{RUN: _tree("device", (), "block_tables, batch_desc",
                                           "input_batch, num_ubatches, uniform_token_count")[RUN]})
    with pytest.raises(HarnessCannot) as caught:
        detect_api(mixed, "0.35.0")
    line = str(caught.value)
    assert "vllm 0.35.0 has an API the harness does not know" in line
    assert "closest is 0.34" in line and "\n" not in line
    assert [m.name for m in missing_marks(Release.V0_34, mixed)] == ["dp_sync_state"]
    assert "vllm/v1/worker/gpu/ubatch_utils.py UBatchRunner.prepare(dp_sync_state)" in line


def test_every_mark_of_each_release_is_needed():
    # Dropping any one mark's parameter from a fitting tree makes that release not fit.
    for release, tree in ((Release.V0_33, V0_33_TREE), (Release.V0_34, V0_34_TREE)):
        for mark in MARKS[release]:
            broken = dict(tree)
            broken[mark.module] = SimpleNamespace(**{
                name: (dataclasses.make_dataclass("X", ("unrelated",)) if
                       name == mark.owner.split(".")[0] else value)
                for name, value in vars(tree[mark.module]).items()})
            assert mark in missing_marks(release, broken), mark


def test_release_is_a_config_field_defaulting_to_the_newest():
    assert HarnessConfig().serving.release is Release.V0_34
    assert HarnessConfig.of(release="0.33").serving.release is Release.V0_33
    with pytest.raises(ConfigError) as caught:
        HarnessConfig.of(release="0.32")
    assert caught.value.field == "release"


needs_vllm = pytest.mark.skipif(vllm_version() is None, reason=unavailable_reason())


@needs_vllm
def test_the_installed_vllm_has_a_known_api():
    from harness.vllm_sut.available import installed_release

    assert installed_release().value == ".".join(vllm_version().split(".")[:2])


@needs_vllm
def test_a_config_modelling_another_release_than_the_vllm_under_test_is_refused():
    from harness.sut import systems
    from harness.vllm_sut.available import installed_release

    other = next(r for r in Release if r is not installed_release())
    with pytest.raises(ConfigError) as caught:
        systems.graph_table(HarnessConfig.of(sut="vllm", release=other.value), 0)
    assert caught.value.field == "release"


@needs_vllm
def test_a_checkout_with_an_unknown_api_exits_3_with_one_line(tmp_path):
    import vllm

    installed = Path(vllm.__file__).parent
    checkout = tmp_path / "vllm"
    for rel in ("v1/worker/ubatch_utils.py", "v1/worker/gpu/dp_utils.py",
                "v1/worker/gpu/cudagraph_utils.py"):
        (checkout / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(installed / rel, checkout / rel)
    (checkout / "_version.py").write_text("__version__ = '9.9.0.dev1'\n")
    cgu = checkout / "v1/worker/gpu/cudagraph_utils.py"
    renamed = cgu.read_text().replace("decode_query_len", "query_len_of_decodes")
    cgu.write_text(renamed)
    result = subprocess.run(
        [sys.executable, "-m", "harness", "decide", "--sut", "vllm", "--vllm-src",
         str(tmp_path), "--tokens", "4,4"], capture_output=True, text=True, cwd=ROOT,
        timeout=240)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 3, result.stderr[-2000:]
    assert len(errors) == 1 and "Traceback" not in result.stderr
    assert "vllm 9.9.0.dev1 has an API the harness does not know" in errors[0]
