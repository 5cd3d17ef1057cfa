# The two commands of the README, and the checks CI runs.
#   make run    set up (first time) and run the local stack in the foreground (Ctrl-C stops it)
#   make test   set up (first time) and run every test on real Kafka and Consul
#   make compose-up / compose-down   the whole mesh in containers (deploy/docker-compose.yml)
#   make compose-test                its tests (tests/compose; part of make test)
SHELL := /bin/bash
VENV := .venv/bin
export PATH := $(CURDIR)/.venv/bin:$(CURDIR)/node_modules/.bin:$(PATH)

.PHONY: imports setup setup-quick run up down test test-long test-unit check lint typecheck protos rules k8s-check \
	bench-short bench-more images compose-up compose-down compose-test

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

test: setup
	$(VENV)/python -m pytest -m "not long" --junitxml=build/test-results.xml

# Everything, the long scenarios too (about 20 minutes more): run by hand for a closing note.
test-long: setup
	$(VENV)/python -m pytest

test-unit:
	$(VENV)/python -m pytest tests/unit

# Container images (deploy/container/), built from Debian packages and cached under
# ~/.cache/dataservice/images; then the compose stack, up once every health check passes.
images:
	$(VENV)/python -m services.devstack.images

compose-up: images
	$(VENV)/python -m services.devstack.compose up

compose-down:
	$(VENV)/python -m services.devstack.compose down

compose-test:
	$(VENV)/python -m pytest tests/compose -v

check: lint typecheck imports protos rules k8s-check

lint:
	$(VENV)/ruff check .
	$(VENV)/ruff format --check .
	@# Test folders have no __init__.py: two test files of one name stop pytest's collection.
	@dups=$$(find tests -name 'test_*.py' -printf '%f\n' | sort | uniq -d); \
	  if [ -n "$$dups" ]; then echo "test file names used twice under tests/: $$dups"; exit 1; fi

# The import structure (.importlinter): the shared layer imports no service, no service imports
# another's package, no import circle (TYPE_CHECKING imports included).
imports:
	$(VENV)/lint-imports --no-cache

typecheck:
	$(VENV)/mypy services spark clients/python

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

# CI's benchmarks: the balancer and the assigner's sessions (about 2 minutes).
bench-short:
	$(VENV)/python tests/bench/bench_balancer.py --short
	$(VENV)/python tests/bench/bench_session.py --short

# The others, run by hand for a closing note (about 35 minutes; CI's time budget): the
# sidecar's data path against a direct consumer, TLS against plaintext, external-reset checks
# on the ack path, metrics overhead, Spark, fenced state writes, failover against Kafka's
# group protocols (about 14 minutes alone, mostly Kafka's 45 s session timeouts), and each
# client through a sidecar against a direct consumer in its language.
bench-more:
	$(VENV)/python tests/bench/bench_sidecar.py --short
	$(VENV)/python tests/bench/bench_tls.py --short
	$(VENV)/python tests/bench/bench_external_check.py --short
	$(VENV)/python tests/bench/bench_metrics_overhead.py --short
	$(VENV)/python tests/bench/bench_spark.py --short
	$(VENV)/python tests/bench/bench_state_writes.py --short
	$(VENV)/python tests/bench/bench_failover.py --short
	$(VENV)/python tests/bench/bench_clients.py
