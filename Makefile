# The two set-up commands the README names: `make lab` (the main job) and `make test` (the tests).
# Both work on a fresh Debian 12 with its own python3 (PEP 668): they make and use a project venv,
# .venv, and install the Debian packages they need, idempotently.
SYSTEM_PYTHON ?= /usr/bin/python3
VENV ?= .venv
PYTHON := $(VENV)/bin/python
# Debian packages the lab and the tests use: real inits as PID 1, real container runtimes (podman, and
# containerd with its CRI plugin), Prometheus and promtool for the alert and dashboard tests.
DEBIAN_PACKAGES ?= tini catatonit podman runc busybox-static containerd containernetworking-plugins prometheus python3-venv
# The suite must pass beside `stress-ng --cpu 2` (docs/development.md): the load it is checked under.
DEBIAN_PACKAGES += stress-ng
# `make image`: podman, and debootstrap for the local Debian base where the pinned one cannot be pulled.
IMAGE_DEBIAN_PACKAGES ?= podman runc debootstrap
# lab-out/, not results/: the committed results/ are the GPU run's and a CPU run must not replace them.
LAB_ARGS ?= --out lab-out
LINTED := src tests benchmarks scripts

.PHONY: help debian venv lab test lint fix proto torch
help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

# $(call apt_install,PACKAGES): install the missing ones (needs root; nothing when all are present).
define apt_install
	@missing=""; for p in $(1); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi
endef

debian:  ## install the Debian packages (needs root; skipped when present)
	$(call apt_install,$(DEBIAN_PACKAGES))

$(PYTHON):
	$(SYSTEM_PYTHON) -m venv $(VENV)
	$(PYTHON) -m pip install -q --upgrade pip

venv: $(PYTHON)  ## make the project venv

# The extras every command of the README needs after `make lab`: the lab's (plot, init, labpod), exporter,
# check and webhook (admission), top's full screen (top). tests/test_readme_commands.py runs them.
LAB_EXTRAS ?= plot,init,labpod,exporter,admission,top
lab: debian venv  ## the main job: the four scenarios on the embedded runtime, into lab-out/
	$(PYTHON) -m pip install -q -e '.[$(LAB_EXTRAS)]'
	$(PYTHON) -m gpuzombie lab run $(LAB_ARGS)

test: debian venv  ## lint, types, the import contracts and the tests (tests/kube on a real cluster)
	$(PYTHON) -m pip install -q -e '.[test]'
	$(PYTHON) -m gpuzombie cluster build --nri  # the multi-call Kubernetes binary (~11 min cold) and the NRI plugin (~1 min), cached in ~/.cache/gpuzombie
	$(PYTHON) -m ruff check $(LINTED)
	$(PYTHON) -m ruff format --check $(LINTED)
	$(PYTHON) -m mypy
	PYTHONPATH=src $(VENV)/bin/lint-imports --no-cache
	$(PYTHON) -m pytest -q

# The CPU build of PyTorch, for `lab run --scenario nccl` (gloo) and graceful's torch tests without a GPU:
# PyPI serves only the CUDA build (about 5 GB with its CUDA wheels); PyTorch's own CPU index has the
# same version as +cpu, which the test extra's pin (torch==TORCH_VERSION) accepts. TORCH_INDEX: a mirror.
TORCH_VERSION ?= 2.13.0
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
torch: venv  ## the CPU build of PyTorch into .venv (lab run --scenario nccl; PyPI has only the CUDA build)
	$(PYTHON) -m pip install -q 'torch==$(TORCH_VERSION)' --index-url $(TORCH_INDEX)

lint: venv  ## ruff, mypy and the import contracts (lint-imports) only
	$(PYTHON) -m ruff check $(LINTED)
	$(PYTHON) -m ruff format --check $(LINTED)
	$(PYTHON) -m mypy
	PYTHONPATH=src $(VENV)/bin/lint-imports --no-cache

PROTO := src/gpuzombie/k8s/podresources_v1/api.proto
proto: venv  ## regenerate the kubelet PodResources stubs (src/gpuzombie/k8s/podresources_v1/api.proto; grpcio-tools of the test extra)
	$(PYTHON) -m grpc_tools.protoc -I src --python_out=src --pyi_out=src --grpc_python_out=src $(PROTO)

fix: venv  ## let ruff fix and format what it can
	$(PYTHON) -m ruff check --fix $(LINTED)
	$(PYTHON) -m ruff format $(LINTED)

# The node agent's image as charts/gpuzombie/Chart.yaml's default names it
# (localhost/gpu-zombie/gpuzombie-node:<appVersion>), built with podman; CD pushes the same target.
# Its Python dependencies are pinned with hashes in docker/*-requirements.txt (installed with
# --require-hashes, so two builds agree); `make image-lock` regenerates them with pip-tools.
.PHONY: image image-lock
image:  ## build the node-agent image with podman (scripts/build-image.sh)
	$(call apt_install,$(IMAGE_DEBIAN_PACKAGES))
	scripts/build-image.sh

LOCK := $(PYTHON) -m piptools compile --quiet --generate-hashes --strip-extras --no-emit-index-url --no-emit-find-links
image-lock: venv  ## re-pin the images' Python dependencies (docker/*-requirements.txt, with hashes)
	$(PYTHON) -m pip install -q -e '.[lock]'
	$(LOCK) --extra exporter --extra top --unsafe-package gpuzombie -o docker/node-requirements.txt pyproject.toml
	$(LOCK) --unsafe-package gpuzombie -o docker/workload-requirements.txt pyproject.toml
	$(LOCK) --allow-unsafe --only-build-deps --all-build-deps -o docker/build-requirements.txt pyproject.toml
