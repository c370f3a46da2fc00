# The two set-up commands the README names: `make lab` (the main job) and `make test` (the tests).
# Both install what they need on a fresh Debian machine, idempotently.
PYTHON ?= python3
# Debian packages the lab and the tests use: real inits as PID 1, a real container runtime for trace.
DEBIAN_PACKAGES ?= tini catatonit podman runc busybox-static
# lab-out/, not results/: the committed results/ are the GPU run's and a CPU run must not replace them.
LAB_ARGS ?= --out lab-out

.PHONY: debian lab test
debian:
	@missing=""; for p in $(DEBIAN_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

# The lab needs only the plots; the tests add the chart tools, grpcio and a CPU build of torch.
lab: debian
	$(PYTHON) -m pip install -q -e '.[plot,init]'
	gpuzombie lab run $(LAB_ARGS)

test: debian
	$(PYTHON) -m pip install -q -e '.[test]'
	$(PYTHON) -m pytest -q
