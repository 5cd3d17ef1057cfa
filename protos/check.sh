#!/usr/bin/env bash
# CI gate for the APIs (ARCHITECTURE §4): buf lint, buf format, generated code up to date,
# and buf breaking against the baseline commit named in protos/BREAKING_BASELINE.
#
# Usage: protos/check.sh               (from any directory)
# Env:   BUF     buf binary (default: node_modules/.bin/buf, installed by `npm ci`)
#        PYTHON  passed through to protos/generate.sh
set -euo pipefail

cd "$(dirname "$0")/.."

BUF="${BUF:-node_modules/.bin/buf}"
if ! command -v "$BUF" >/dev/null 2>&1; then
  echo "check.sh: buf not found at '$BUF'; run 'npm ci' in the repo root (or set BUF)" >&2
  exit 1
fi

echo "==> buf lint"
"$BUF" lint

echo "==> buf format --diff --exit-code"
if ! "$BUF" format --diff --exit-code; then
  echo "check.sh: protos are not buf-formatted; run '$BUF format -w'" >&2
  exit 1
fi

echo "==> regenerate clients/python/src/dataservice"
bash protos/generate.sh

echo "==> generated code is committed and up to date"
changes="$(git status --porcelain --untracked-files=all -- clients/python/src/dataservice)"
if [[ -n "$changes" ]]; then
  echo "$changes" >&2
  echo "check.sh: clients/python/src/dataservice differs from the committed tree after" \
    "regenerating; run protos/generate.sh and commit it" >&2
  exit 1
fi

echo "==> buf breaking"
baseline_file=protos/BREAKING_BASELINE
baseline=""
if [[ -f "$baseline_file" ]]; then
  # First non-empty, non-comment line.
  baseline="$(sed -e 's/#.*//' -e 's/[[:space:]]//g' "$baseline_file" | grep -m1 . || true)"
fi
if [[ -z "$baseline" ]]; then
  echo "check.sh: breaking check skipped: no baseline yet ($baseline_file is missing or empty)"
else
  if ! git rev-parse --quiet --verify "${baseline}^{commit}" >/dev/null; then
    echo "check.sh: $baseline_file names '$baseline', which is not a commit in this" \
      "repository (shallow clone? fetch more history)" >&2
    exit 1
  fi
  "$BUF" breaking protos --against ".git#ref=${baseline},subdir=protos"
fi

echo "check.sh: all API checks passed"
