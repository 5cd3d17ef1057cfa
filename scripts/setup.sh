#!/usr/bin/env bash
# Installs everything the project needs on a fresh machine, and nothing by hand:
#   * a Python virtualenv in .venv with the project (editable) and its dev tools;
#   * buf (npm package @bufbuild/buf, pinned in package-lock.json) in node_modules/;
#   * Apache Kafka's jars (Maven Central, deploy/kafka/pom.xml), and Spark's Kafka source
#     (deploy/spark/pom.xml, for the Spark benchmark);
#   * grpcurl and Consul 1.14 built from the Go module proxy (deploy/*/build.sh).
# Every download is cached under ~/.cache (pip, npm, Maven via ~/.m2, Go modules and the
# built binaries under ~/.cache/dataservice), so a second run takes seconds; nothing
# depends on the cache being there. Needs: python3 (>= 3.11), java 17 + mvn, go, node/npm.
#
#   scripts/setup.sh          everything
#   scripts/setup.sh --quick  skip the Go builds (grpcurl, Consul): enough to run the stack
set -euo pipefail

cd "$(dirname "$0")/.."
export DS_CACHE_DIR="${DS_CACHE_DIR:-$HOME/.cache/dataservice}"
QUICK=0
[[ "${1:-}" == "--quick" ]] && QUICK=1

step() { printf '\n== %s\n' "$*" >&2; }

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
# The spark extra (PySpark, pyarrow, pandas, matplotlib): the Spark tests and jobs need it.
.venv/bin/python -m pip install --quiet -e '.[dev,spark]'

step "buf (npm @bufbuild/buf)"
npm ci --no-audit --no-fund --loglevel=error --cache "$HOME/.cache/dataservice/npm"

step "Apache Kafka jars (Maven Central)"
.venv/bin/python -c 'from services.devstack.kafka import ensure_kafka_jars; print(ensure_kafka_jars())'

if [[ $QUICK == 0 ]]; then
  step "Spark's Kafka source jars for the Spark benchmark (Maven Central, deploy/spark/pom.xml)"
  .venv/bin/python -m spark.kafka_jars >/dev/null
  step "grpcurl (Go module proxy)"
  bash deploy/grpcurl/build.sh
  step "Consul 1.14 (Go module proxy)"
  bash deploy/consul/build.sh
fi
step "setup done"
