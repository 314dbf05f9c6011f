# Where torch already imports (the GPU machine, which has no package registry) the
# interpreter is used as it is; elsewhere a .venv is built with the CPU wheel of torch.
SYSTEM_PYTHON ?= python3
TORCH_PIN ?= torch==2.13.0
NPROC ?= 2
BACKEND ?= gloo
DEVICE ?=
PYTEST_WORKERS ?= 2

HAVE_TORCH := $(shell $(SYSTEM_PYTHON) -c "import torch" >/dev/null 2>&1 && echo yes)
ifeq ($(HAVE_TORCH),yes)
PYTHON := $(SYSTEM_PYTHON)
ENV_STAMP :=
else
PYTHON := .venv/bin/python
ENV_STAMP := .venv/.installed
endif

# The vLLM release the vLLM targets install and test: requirements/vllm-$(VLLM).txt pins it.
VLLM ?= 0.34.0
VLLM_REQUIREMENTS := requirements/vllm-$(VLLM).txt

FUZZ_SECONDS ?= 60
FUZZ_LOG ?= .harness/fuzz-log.jsonl

.PHONY: env redis test test-dp test-multinode vllm-install test-vllm test-gpu vllm-gpu-bundle test-vllm-gpu fuzz fuzz-campaign report bench bench-gpu lint clean

env: $(ENV_STAMP)

.venv/.installed: pyproject.toml
	$(SYSTEM_PYTHON) -m venv .venv
	.venv/bin/pip install --quiet --upgrade pip
	.venv/bin/pip install --quiet $(TORCH_PIN)
	.venv/bin/pip install --quiet -e '.[dev]'
	touch $@

# Debian's redis-server, for fuzz campaigns and their tests, installed where missing (bounded);
# where it cannot be installed, those tests skip with the reason.
redis:
	@command -v redis-server >/dev/null 2>&1 || (timeout 300 apt-get install -y -qq redis-server \
		|| (timeout 300 apt-get update -qq && timeout 300 apt-get install -y -qq redis-server)) \
		>/dev/null 2>&1 || echo "redis-server could not be installed here: Redis tests will skip"

test: $(ENV_STAMP) redis
	$(PYTHON) -m pytest -q -rs -n $(PYTEST_WORKERS) -m "not slow and not gpu" tests

# The distributed suite on an NPROC-rank torchrun world: every regression scenario, a
# Hypothesis pass over DP skew, the fault tests; ends with a table of every scenario run.
# NNODES=N: one DP world of N x NPROC ranks over N torchrun agents (c10d rendezvous at RDZV,
# host:port; without RDZV every node runs here on loopback). NODE_RANK=0 runs the suite (the
# driver); NODE_RANK>0 runs that node's agent only. Nodes share DBO_HARNESS_CONTROL_KEY.
# On one node the suite runs DIST_WORKERS pytest workers, each with its own world: much of a
# failing example is a wait (a hang's timeout, a spare's boot), so two share two cores well;
# NCCL worlds (the GPU machine: 16 cores, the ranks time-slicing one GPU) run four.
NNODES ?= 1
NODE_RANK ?= 0
DIST_WORKERS ?= $(if $(filter nccl,$(BACKEND)),4,2)
RDZV ?=
test-dp: $(ENV_STAMP)
ifneq ($(NODE_RANK),0)
	$(PYTHON) -m harness.world.node --nnodes $(NNODES) --node-rank $(NODE_RANK) \
		--rdzv-endpoint $(RDZV) --nproc $(NPROC)
else
	$(PYTHON) -m pytest -q -rs -m dist --world torchrun --nproc $(NPROC) --backend $(BACKEND) \
		$(if $(filter 1,$(NNODES)),-n $(DIST_WORKERS) --dist worksteal) \
		$(if $(DEVICE),--device $(DEVICE)) $(if $(filter-out 1,$(NNODES)),--nnodes $(NNODES) \
		$(if $(RDZV),--rdzv-endpoint $(RDZV))) tests
endif

# A short two-node lane on one machine, run as a cluster runs it (harness/world/multinode/lane.py):
# node 1 is `python -m harness.world.node`, node 0 the pytest driver with its own agent; c10d
# rendezvous on 127.0.0.1 at a port free now. Either failing stops the other; bounded twice.
# The multi-node tests (a rebuild after a killed rank, a lost node, a signalled driver), a
# fault and four regression scenarios on the lane's DP world of 2 x NPROC ranks.
MULTINODE_SECONDS ?= 300
MULTINODE_SCENARIOS := guard-equality unreachable-twin replay-lookback-stale staging-restore-permuted
MULTINODE_TESTS := \
	$(foreach s,$(MULTINODE_SCENARIOS),'tests/test_distributed_suite.py::test_each_regression_scenario_is_caught_on_the_world_and_clean_in_the_reference[$(s)]') \
	tests/test_distributed_suite.py::test_every_rank_stops_after_a_step_in_which_any_rank_failed \
	tests/test_multinode_world.py \
	tests/test_node_watch.py::test_no_launcher_agent_or_worker_outlives_a_driver_that_was_signalled
test-multinode: $(ENV_STAMP)
	timeout --kill-after=30 $$(( $(MULTINODE_SECONDS) + 60 )) $(PYTHON) -m harness.world.multinode.lane \
		--nproc $(NPROC) --seconds $(MULTINODE_SECONDS) -- -q -rs -m dist $(MULTINODE_TESTS)

# A GPU lane where no CUDA GPU is would be a green run of skips: it stops in one line (exit 3).
NEED_GPU = @$(PYTHON) -c "import sys, torch; torch.cuda.is_available() or (print('ERROR: make $@: \
	no CUDA GPU is visible here (torch.cuda.is_available() is False)', file=sys.stderr), sys.exit(3))"

# The GPU suite: real CUDA graphs and NCCL on the single-rank GPU world (one H200 is enough),
# with what the GPU machine has installed.
test-gpu: $(ENV_STAMP)
	$(NEED_GPU)
	$(PYTHON) -m pytest -q -rs -m gpu tests

# Eager, eager microbatched, FULL and microbatched FULL steps of the miniature MoE at decode
# sizes on the GPU (CUDA-event medians), graph pool memory, memory of unreachable twins;
# the DP table under the harness's execution and, where the bundle is carried, vLLM's.
bench-gpu: $(ENV_STAMP)
	$(NEED_GPU)
	site=$$($(PYTHON) tools/vllm_gpu_bundle.py install 2>/dev/null); \
	PYTHONPATH=$$site:. $(PYTHON) -m harness.bench.gpu

# vLLM's own decision and execution code as the system under test (VLLM=0.34.0 by default,
# VLLM=0.33.0 the release before). vllm pins a CUDA torch, so it goes in with --no-deps on top
# of the torch here, with its pure-Python requirements pinned (about 1.5 GB more and 2-3
# minutes the first time). A release without a requirements file, or an install that fails,
# stops the target: it never turns into a green run of skipped tests.
VLLM_TESTS := tests/test_vllm_sut.py tests/test_vllm_fuzz.py tests/test_vllm_patch.py \
	tests/test_vllm_patches.py tests/test_vllm_draft_tokens.py tests/test_vllm_exec.py \
	tests/test_vllm_exec_checkers.py tests/test_vllm_exec_fuzz.py tests/test_vllm_api.py \
	tests/test_vllm_exec_faulted.py tests/test_exec_reference.py \
	tests/test_vllm_in_sandbox.py
vllm-install: $(ENV_STAMP)
	@test -f $(VLLM_REQUIREMENTS) || { echo "ERROR: VLLM=$(VLLM): no $(VLLM_REQUIREMENTS) (known:" \
		$$(ls requirements | sed -n 's/^vllm-\(.*\)\.txt$$/\1/p')")"; exit 2; }
	$(PYTHON) -m pip install --quiet --no-deps -r $(VLLM_REQUIREMENTS) \
		|| { echo "ERROR: vllm $(VLLM) could not be installed here"; exit 3; }
	@$(PYTHON) -c "import vllm, sys; v = vllm.__version__; \
		sys.exit(0 if v == '$(VLLM)' else f'ERROR: vllm {v} imports, not $(VLLM)')"

test-vllm: vllm-install
	HARNESS_REQUIRE_VLLM=$(VLLM) $(PYTHON) -m pytest -q -rs -n $(PYTEST_WORKERS) --dist loadgroup \
		$(VLLM_TESTS)

# vLLM's execution code on CUDA ranks over NCCL, for the GPU machine, which has no package
# registry. Here: `make vllm-gpu-bundle` packs vLLM's Python files and the Python 3.12 wheels
# it needs into build/vllm-gpu (about 27 MiB). There, with build/vllm-gpu carried:
# `make test-vllm-gpu` installs the bundle into build/vllm-gpu/site and runs the vLLM
# execution tests on real streams, events and CUDA graphs.
vllm-gpu-bundle: vllm-install
	$(PYTHON) tools/vllm_gpu_bundle.py pack --requirements $(VLLM_REQUIREMENTS)

test-vllm-gpu: $(ENV_STAMP)
	$(NEED_GPU)
	site=$$($(PYTHON) tools/vllm_gpu_bundle.py install) || exit 1; \
	PYTHONPATH=$$site:. $(PYTHON) -m pytest -q -rs -m gpu tests/test_vllm_exec.py

# The fuzzer's self-check on an NPROC-rank torchrun world: every planted bug must be found
# and shrunk from an empty example database within FUZZ_SECONDS, and the reference must stay
# clean; then the report (JUnit XML, verdict JSON, markdown, decision maps) goes to report/.
fuzz: $(ENV_STAMP)
	rm -f $(FUZZ_LOG)
	$(PYTHON) -m harness fuzz --variant all --world torchrun --nproc $(NPROC) \
		--seconds $(FUZZ_SECONDS) --no-database --log $(FUZZ_LOG); \
	status=$$?; $(PYTHON) -m harness report --log $(FUZZ_LOG) --out report; exit $$status

# JOBS fuzz processes with different seeds sharing one example database: REDIS=redis://host:port/db
# when given, else a Redis server started on a free loopback port for the campaign and stopped
# after; a failure one job finds is replayed by the others. Their logs merge into one report/.
JOBS ?= 2
REDIS ?=
CAMPAIGN_FLAGS ?= --variant all --world torchrun --nproc $(NPROC) --seconds $(FUZZ_SECONDS)
fuzz-campaign: $(ENV_STAMP) redis
	rm -f $(FUZZ_LOG)
	$(PYTHON) -m harness.campaign --jobs $(JOBS) $(if $(REDIS),--database $(REDIS)) \
		--log $(FUZZ_LOG) --out report $(CAMPAIGN_FLAGS)

report: $(ENV_STAMP)
	$(PYTHON) -m harness report --log $(FUZZ_LOG) --out report

# Examples per second through the persistent 2-rank torchrun world, against a fresh torchrun
# job per example and against the bare collectives of a step; prints one table.
bench: $(ENV_STAMP)
	$(PYTHON) -m harness.bench

lint: $(ENV_STAMP)
	$(PYTHON) -m ruff check .

clean:
	rm -rf .venv .pytest_cache .ruff_cache .hypothesis .harness report
