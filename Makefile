# modeldeploy: `make demo` runs the main job on the embedded tiny model, `make test` passes the tests.
SHELL := /bin/bash
PY ?= .venv/bin/python
PIP ?= .venv/bin/pip
OUT ?= out

.PHONY: setup test unit lint demo demo-generate demo-model clean crds cluster cluster-down cluster-build example-model real-node-build images example

setup: .venv/.installed

.venv/.installed: pyproject.toml devtools/pyproject.toml
	test -x $(PY) || python3 -m venv .venv
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[runtime,dev]' -e devtools
	touch $@

test: setup cluster-build
	$(PY) -m pytest -q -ra tests e2e

unit: setup
	$(PY) -m pytest -q -m "not e2e and not slow" tests

lint: setup
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .

demo-model: setup
	$(PY) -m modeldeploy tiny-model $(OUT)/tiny-llama --arch llama --seed 0

# The rollout story (README "make demo"): own local cluster "demo", operator, tiny model, good bundle
# promoted, slow bundle rolled back, live status table, everything torn down.
demo: setup cluster-build
	$(PY) -m modeldeploy demo --workdir $(OUT)/demo

demo-generate: demo-model
	$(PY) -m modeldeploy generate --model $(OUT)/tiny-llama --max-tokens 24 \
		--prompt "The quick brown fox" --prompt "Kubernetes schedules pods onto" \
		--prompt "A paged KV cache stores"

clean:
	rm -rf $(OUT) build *.egg-info

crds: setup
	$(PY) -m modeldeploy crd

# The model examples/modeldeployment-tiny.yaml pins (seeded: its digest is fixed).
EXAMPLE_MODEL_DIR ?= /var/lib/modeldeploy/models/tiny-llama
example-model: setup
	$(PY) -m modeldeploy tiny-model $(EXAMPLE_MODEL_DIR) --arch llama --seed 0
	$(PY) -m modeldeploy digest $(EXAMPLE_MODEL_DIR)

# Local Kubernetes (e2e/cluster): pinned etcd/kube-*/kwok/helm compiled from Go modules into
# ~/.cache/modeldeploy (cached), started by kwokctl, plus the process node. See README "Local cluster".
cluster-build:
	bash devtools/modeldeploy_dev/cluster/build.sh

# The real worker node (kubelet, kube-proxy, containerd v2, registry, pause image): opt-in, see
# README "Real node". Debian's runc, containernetworking-plugins and iptables must be installed.
real-node-build:
	bash devtools/modeldeploy_dev/cluster/build-node.sh

# The runtime (EXTRAS=runtime) and operator images, built on a debootstrapped Debian base and pushed to
# the loopback registry ($$MODELDEPLOY_CLUSTER_REGISTRY_PORT, default 5000); prints both repo@sha256 refs.
images: setup real-node-build
	$(PY) -m modeldeploy_dev.cluster.realnode.images

# The example manifests pinned to the images `make images` pushed: $(OUT)/examples/ (the examples in
# git keep a placeholder digest), plus operator-values.yaml for helm.
example: setup real-node-build
	$(PY) -m modeldeploy_dev.cluster.realnode.images --examples $(OUT)/examples

cluster: setup cluster-build
	$(PY) -m modeldeploy cluster up

cluster-down: setup
	$(PY) -m modeldeploy cluster down
