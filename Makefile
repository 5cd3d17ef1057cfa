# The two commands of the README, and the checks CI runs.
#   make run    set up (first time) and run the local stack in the foreground (Ctrl-C stops it)
#   make test   set up (first time) and run every test on real Kafka and Consul
#   make compose-up / compose-down   the whole mesh in containers (deploy/docker-compose.yml)
#   make compose-test                its tests (tests/compose; part of make test)
SHELL := /bin/bash
VENV := .venv/bin
# The Python client's wheel and the virtual environments it is tested in (make client-python).
CLIENT_PY := build/client-python
export PATH := $(CURDIR)/.venv/bin:$(CURDIR)/node_modules/.bin:$(PATH)

.PHONY: imports setup setup-quick run up down test test-long test-unit check lint typecheck protos rules k8s-check k8s-up k8s-down k8s-build test-k8s \
	bench-short bench-more images compose-up compose-down compose-test client-go client-go-gen client-go-check \
	docs docs-gen docs-check \
	client-java client-java-check client-python clients

setup:
	scripts/setup.sh

setup-quick:
	scripts/setup.sh --quick

run: setup-quick
	$(VENV)/dsctl dev up

up: setup-quick
	$(VENV)/dsctl dev up --detach

down:
	$(VENV)/dsctl dev down

# tests/unit first, on two pytest-xdist workers (pure logic and in-process servers on free
# ports; much of its time is waits, so two workers halve it), then everything else in one
# process (real Kafka, Consul and mesh processes per test: not run side by side).
test: setup clients/go/bin/dsread clients/java/target/dsread.jar $(CLIENT_PY)/venv/bin/python
	$(VENV)/python -m pytest tests/unit -n 2 -m "not long" --junitxml=build/test-results-unit.xml
	$(VENV)/python -m pytest -m "not long" --ignore=tests/unit --junitxml=build/test-results.xml

# tests/clients runs each client's conformance reader: built here when missing (a fresh
# clone); `make clients` rebuilds and tests all three after a change to them.
clients/go/bin/dsread:
	$(MAKE) client-go

clients/java/target/dsread.jar:
	$(MAKE) client-java

$(CLIENT_PY)/venv/bin/python:
	$(MAKE) client-python

clients: client-go client-java client-python

# Everything, the long scenarios too (about 20 minutes more): run by hand for a closing note.
test-long: setup
	$(VENV)/python -m pytest

test-unit:
	$(VENV)/python -m pytest tests/unit

# Container images (deploy/container/), built from Debian packages and cached under
# ~/.cache/dataservice/images; then the compose stack, up once every health check passes.
images:
	$(VENV)/python -m services.devstack.images

# Secure by default (mTLS and tokens; the PKI in deploy/.compose/pki); PLAINTEXT=1 is a
# developer's opt-in to no TLS, no tokens.
compose-up: images
	$(VENV)/python -m services.devstack.compose up $(if $(PLAINTEXT),--plaintext)

compose-down:
	$(VENV)/python -m services.devstack.compose down

compose-test:
	$(VENV)/python -m pytest tests/compose -v

check: lint typecheck imports protos rules k8s-check client-go-check client-java-check docs-check

lint:
	$(VENV)/ruff check .
	$(VENV)/ruff format --check .
	@# Test folders have no __init__.py: two test files of one name stop pytest's collection.
	@dups=$$(find tests clients/python/tests -name 'test_*.py' -printf '%f\n' | sort | uniq -d); \
	  if [ -n "$$dups" ]; then echo "test file names used twice under tests/, clients/python/tests/: $$dups"; exit 1; fi

# The import structure (.importlinter): the shared layer imports no service, no service imports
# another's package, no import circle (TYPE_CHECKING imports included), no test module imports
# another test module (tests/support/import_contracts.py).
imports:
	$(VENV)/lint-imports --no-cache

typecheck:
	$(VENV)/mypy services spark clients/python/src clients/python/dsread.py scripts \
		tests/support tests/bench

protos:
	bash protos/check.sh

# deploy/: both Prometheus configs (Debian's promtool lacks Consul SD: the Consul config is
# then checked with its SD block replaced, see tests/support/prom.py), the rules, their
# unit tests, and the Alertmanager config.
rules:
	$(VENV)/python -m tests.support.prom check-config \
		deploy/prometheus/prometheus.yml deploy/prometheus/prometheus-static.yml \
		deploy/prometheus/prometheus-compose.yml
	promtool check rules deploy/prometheus/rules/*.yml
	promtool test rules deploy/prometheus/tests/*.yml
	amtool check-config deploy/alertmanager/alertmanager.yml

# deploy/k8s: every overlay rendered with kustomize (deploy/kustomize, built on first use) and
# every document, the examples and their injected form validated against Kubernetes' schemas
# (kubernetes-validate, strict), plus the rules copies, image tag and sidecar template.
k8s-check:
	$(VENV)/python -m tests.support.k8s check

# A real Kubernetes control plane on this machine (issue 40): etcd, kube-apiserver and
# kube-controller-manager built from the Go module proxy (deploy/k8s-control-plane/build.sh,
# cached under ~/.cache/dataservice/k8s/<version>); no kubelet, no scheduler. k8s-up prints
# the kubeconfig path (state in ~/.cache/dataservice/k8s/cluster, or $$DS_K8S_DIR).
k8s-up:
	$(VENV)/python -m services.devstack.kube up

# The control plane's binaries alone (make setup builds them too; CI builds them here, beside
# the container images and the clients): at once when cached.
k8s-build:
	bash deploy/k8s-control-plane/build.sh

k8s-down:
	$(VENV)/python -m services.devstack.kube down

# tests/k8s: the manifests, the injector webhook and the DsGroup resources against that API
# server (started by the tests' own session fixture; part of make test).
test-k8s:
	$(VENV)/python -m pytest tests/k8s -v

# CI's benchmarks: the balancer and the assigner's sessions (about 2 minutes).
bench-short:
	$(VENV)/python tests/bench/bench_balancer.py --short
	$(VENV)/python tests/bench/bench_session.py --short

# The others, run by hand for a closing note (about 35 minutes; CI's time budget): the
# sidecar's data path against a direct consumer, TLS against plaintext, external-reset checks
# on the ack path, metrics overhead, Spark, ReadRange's consumer pool, fenced state writes,
# failover against Kafka's group protocols (about 14 minutes alone, mostly Kafka's 45 s session timeouts), each
# client through a sidecar against a direct consumer in its language, and a pod's cost at
# 100 and 1,000 records/s against direct consumers (about 3 minutes; not in bench-short:
# it runs a dozen processes at once and would double CI's benchmark time) with what one
# hand-off to an event loop costs beside it (half a minute).
bench-more:
	$(VENV)/python tests/bench/bench_sidecar.py --short
	$(VENV)/python tests/bench/bench_pod_cost.py --short
	$(VENV)/python tests/bench/bench_loop_wake.py --short
	$(VENV)/python tests/bench/bench_tls.py --short
	$(VENV)/python tests/bench/bench_external_check.py --short
	$(VENV)/python tests/bench/bench_metrics_overhead.py --short
	$(VENV)/python tests/bench/bench_spark.py --short
	$(VENV)/python tests/bench/bench_range_reads.py --short
	$(VENV)/python tests/bench/bench_state_writes.py --short
	$(VENV)/python tests/bench/bench_failover.py --short
	$(VENV)/python tests/bench/bench_clients.py

# The Go client (clients/go, issue 20): the plugins protoc-gen-go and protoc-gen-go-grpc
# built from the Go module proxy at pinned versions into ~/.cache/dataservice/go-bin (no
# remote buf plugins), the code generated by buf into clients/go/gen, bin/dsread built,
# go vet, gofmt and go test. Go's caches stay under ~/.cache.
GO ?= /usr/local/go/bin/go
BUF ?= node_modules/.bin/buf
GO_BIN := $(HOME)/.cache/dataservice/go-bin
GO_ENV := GOMODCACHE=$(HOME)/.cache/go-mod GOCACHE=$(HOME)/.cache/go-build GOFLAGS=-mod=readonly
PROTOC_GEN_GO_VERSION := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.6.2

$(GO_BIN)/protoc-gen-go-$(PROTOC_GEN_GO_VERSION):
	mkdir -p $(GO_BIN)
	$(GO_ENV) GOBIN=$(GO_BIN) $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
	touch $@

$(GO_BIN)/protoc-gen-go-grpc-$(PROTOC_GEN_GO_GRPC_VERSION):
	mkdir -p $(GO_BIN)
	$(GO_ENV) GOBIN=$(GO_BIN) $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)
	touch $@

client-go-gen: $(GO_BIN)/protoc-gen-go-$(PROTOC_GEN_GO_VERSION) $(GO_BIN)/protoc-gen-go-grpc-$(PROTOC_GEN_GO_GRPC_VERSION)
	@test -x $(BUF) || { echo "$(BUF) not found: run make setup (it installs buf)"; exit 1; }
	rm -rf clients/go/gen
	PATH=$(GO_BIN):$$PATH $(BUF) generate protos --template clients/go/buf.gen.yaml

client-go: client-go-gen
	cd clients/go && $(GO_ENV) $(GO) build -o bin/dsread ./cmd/dsread
	cd clients/go && $(GO_ENV) $(GO) vet ./...
	@unformatted="$$(cd clients/go && $(dir $(GO))gofmt -l dsclient cmd)"; \
	  if [ -n "$$unformatted" ]; then echo "not gofmt-formatted: $$unformatted"; exit 1; fi
	cd clients/go && $(GO_ENV) $(GO) test ./...

# The generated Go code is what the protos give today (as protos/check.sh for Python).
client-go-check: client-go-gen
	@changes="$$(git status --porcelain --untracked-files=all -- clients/go/gen)"; \
	  if [ -n "$$changes" ]; then echo "$$changes"; \
	    echo "clients/go/gen differs from the committed tree: run make client-go-gen and commit it"; exit 1; fi

# The Java client (clients/java, docs/client-protocol.md): protoc and protoc-gen-grpc-java are
# Maven Central's executables (cached in ~/.cache/dataservice/java-bin), Maven's repository is
# ~/.cache/m2. client-java regenerates the code, runs the JUnit tests and builds
# clients/java/target/dsread.jar; client-java-check fails if the committed generated code
# differs from a fresh generation.
MVN := mvn -B -q -Dmaven.repo.local=$(HOME)/.cache/m2

client-java:
	bash clients/java/generate.sh
	cd clients/java && $(MVN) package

client-java-check:
	bash clients/java/generate.sh
	git diff --exit-code -- clients/java/src/generated
	@new=$$(git ls-files --others --exclude-standard -- clients/java/src/generated); \
	  if [ -n "$$new" ]; then echo "generated files not committed: $$new"; exit 1; fi

# The Python client (clients/python, issue 35), as an application gets it: its wheel built
# from a copy of the package (the tree stays clean; by the project's setuptools, without a
# build environment of its own), installed into a fresh virtual environment with nothing
# else of the project, not even pip ($(CLIENT_PY)/venv: the project's pip installs into it;
# tests/clients run clients/python/dsread.py there, python -I so no PYTHONPATH reaches it),
# checked to import nothing of the mesh's servers nor the extras; then its unit tests
# (clients/python/tests) run in a second environment holding the wheel with its arrow extra
# and the test tools, from clients/python, so they import the installed wheel, not the
# sources.
CLIENT_PY_TEST_TOOLS := pytest==9.2.0 pytest-timeout==2.4.0 hypothesis==6.170.15
CLIENT_PY_PIP := $(VENV)/python -m pip --quiet

client-python:
	rm -rf $(CLIENT_PY)
	mkdir -p $(CLIENT_PY)/package
	cp -r clients/python/pyproject.toml clients/python/README.md clients/python/src $(CLIENT_PY)/package/
	find $(CLIENT_PY)/package \( -name __pycache__ -o -name '*.egg-info' \) -prune -exec rm -rf {} +
	$(CLIENT_PY_PIP) wheel --no-deps --no-build-isolation --wheel-dir $(CLIENT_PY)/dist $(CLIENT_PY)/package
	python3 -m venv --without-pip $(CLIENT_PY)/venv
	$(CLIENT_PY_PIP) --python $(CLIENT_PY)/venv/bin/python install --no-compile $(CLIENT_PY)/dist/dataservice_client-*.whl
	$(VENV)/python -m pip --python $(CLIENT_PY)/venv/bin/python list
	cd $(CLIENT_PY) && venv/bin/python -I -c 'import sys, dsclient; \
	  print("dsclient", dsclient.__version__, "from", dsclient.__file__); \
	  leaked = sorted({m.split(".")[0] for m in sys.modules} & {"services", "spark", "pyarrow", "numpy", "consul", "structlog"}); \
	  sys.exit(f"importing dsclient imported {leaked}" if leaked else 0)'
	python3 -m venv --without-pip $(CLIENT_PY)/venv-test
	$(CLIENT_PY_PIP) --python $(CLIENT_PY)/venv-test/bin/python install --no-compile \
	  "$$(ls $(CLIENT_PY)/dist/dataservice_client-*.whl)[arrow]" $(CLIENT_PY_TEST_TOOLS)
	cd clients/python && ../../$(CLIENT_PY)/venv-test/bin/python -I -m pytest tests

# The documentation site (docs/, mkdocs.yml). docs serves it on 127.0.0.1:8000; docs-gen
# rewrites the reference pages from the code; docs-check (in check) fails when one of them is
# stale, then builds the site with --strict (broken links and pages left out of the nav fail)
# into build/site.
docs: setup-quick
	NO_MKDOCS_2_WARNING=1 $(VENV)/mkdocs serve --dev-addr 127.0.0.1:8000

docs-gen:
	$(VENV)/python scripts/gen_docs.py

docs-check:
	$(VENV)/python scripts/gen_docs.py --check
	NO_MKDOCS_2_WARNING=1 $(VENV)/mkdocs build --strict --quiet
