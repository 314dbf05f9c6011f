# Where torch already imports (the GPU machine, which has no package registry) the
# interpreter is used as it is; elsewhere a .venv is built with the CPU wheel of torch.
SYSTEM_PYTHON ?= python3
TORCH_PIN ?= torch==2.13.0
NPROC ?= 2
BACKEND ?= gloo
PYTEST_WORKERS ?= 2

HAVE_TORCH := $(shell $(SYSTEM_PYTHON) -c "import torch" >/dev/null 2>&1 && echo yes)
ifeq ($(HAVE_TORCH),yes)
PYTHON := $(SYSTEM_PYTHON)
ENV_STAMP :=
else
PYTHON := .venv/bin/python
ENV_STAMP := .venv/.installed
endif

.PHONY: env test test-dp bench lint clean

env: $(ENV_STAMP)

.venv/.installed: pyproject.toml
	$(SYSTEM_PYTHON) -m venv .venv
	.venv/bin/pip install --quiet --upgrade pip
	.venv/bin/pip install --quiet $(TORCH_PIN)
	.venv/bin/pip install --quiet -e '.[dev]'
	touch $@

test: $(ENV_STAMP)
	$(PYTHON) -m pytest -q -n $(PYTEST_WORKERS) -m "not slow and not gpu" tests

# The distributed suite on an NPROC-rank torchrun world: every regression scenario, a
# Hypothesis pass over DP skew, the fault tests; ends with a table of every scenario run.
test-dp: $(ENV_STAMP)
	$(PYTHON) -m pytest -q -m dist --world torchrun --nproc $(NPROC) --backend $(BACKEND) tests

# Examples per second through the persistent 2-rank torchrun world, against a fresh torchrun
# job per example and against the bare collectives of a step; prints one table.
bench: $(ENV_STAMP)
	$(PYTHON) -m harness.bench

lint: $(ENV_STAMP)
	$(PYTHON) -m ruff check .

clean:
	rm -rf .venv .pytest_cache .ruff_cache .hypothesis
