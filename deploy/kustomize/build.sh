#!/usr/bin/env bash
# Build the kustomize CLI (Apache-2.0) from the Go module proxy, using the module pinned in
# deploy/kustomize/go.mod + go.sum. `make k8s-check` renders deploy/k8s/overlays/* with it:
# the same renderer `kubectl apply -k` / `kubectl kustomize` embed, so what is validated is
# what a cluster would receive.
#
#   deploy/kustomize/build.sh            -> prints the binary path on the last stdout line
#
# Output: $DS_CACHE_DIR/bin/kustomize   (DS_CACHE_DIR defaults to $HOME/.cache/dataservice)
# Idempotent: if the binary exists and reports the pinned version, it exits at once
# (a cold build takes about a minute on 2 cores). Set DS_FORCE_REBUILD=1 to rebuild anyway.
# Progress goes to stderr; stdout carries only the path.
#
# Env knobs: DS_CACHE_DIR, DS_FORCE_REBUILD, GOPROXY (default https://proxy.golang.org,direct),
#            GO (go binary, default `go` on PATH).
set -euo pipefail

log() { printf '[kustomize/build] %s\n' "$*" >&2; }

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DS_CACHE_DIR="${DS_CACHE_DIR:-$HOME/.cache/dataservice}"
BIN_DIR="$DS_CACHE_DIR/bin"
OUT="$BIN_DIR/kustomize"
GO="${GO:-go}"
MAIN_PKG="sigs.k8s.io/kustomize/kustomize/v5"

PINNED="$(awk '$1=="require" && $2=="sigs.k8s.io/kustomize/kustomize/v5" {print $3}' "$SCRIPT_DIR/go.mod")"
[[ -n "$PINNED" ]] || { log "cannot find $MAIN_PKG in $SCRIPT_DIR/go.mod"; exit 1; }

# `kustomize version` prints the module version it was built from (v5.8.2), or nothing.
kustomize_version() {
  "$1" version 2>/dev/null | head -n1 | tr -d '[:space:]' || true
}

is_good() {
  [[ -x "$1" ]] && [[ "$(kustomize_version "$1")" == "$PINNED" ]]
}

if [[ "${DS_FORCE_REBUILD:-0}" != "1" ]] && is_good "$OUT"; then
  log "up to date: $OUT (kustomize $PINNED)"
  echo "$OUT"
  exit 0
fi

command -v "$GO" >/dev/null 2>&1 || { log "go toolchain not found (set GO=/path/to/go)"; exit 1; }
mkdir -p "$BIN_DIR"

# Serialise concurrent builds; re-check after acquiring the lock.
if command -v flock >/dev/null 2>&1; then
  exec 9>"$BIN_DIR/.kustomize.build.lock"
  flock 9
  if [[ "${DS_FORCE_REBUILD:-0}" != "1" ]] && is_good "$OUT"; then
    log "built by a concurrent run: $OUT"
    echo "$OUT"
    exit 0
  fi
fi

export GOMODCACHE="$DS_CACHE_DIR/go/mod"
export GOCACHE="$DS_CACHE_DIR/go/build"
export GOPROXY="${GOPROXY:-https://proxy.golang.org,direct}"
# go.sum is committed and -mod=readonly refuses to change it: every module is verified.
export GOFLAGS="-mod=readonly -buildvcs=false"
export CGO_ENABLED=0
mkdir -p "$GOMODCACHE" "$GOCACHE"

TMP="$(mktemp "$BIN_DIR/.kustomize.tmp.XXXXXX")"
trap 'rm -f "$TMP"' EXIT

log "building $MAIN_PKG@$PINNED with $("$GO" version)"
start=$(date +%s)
(
  cd "$SCRIPT_DIR"
  "$GO" build -trimpath -ldflags "-s -w" -o "$TMP" "$MAIN_PKG" >&2
)
chmod 0755 "$TMP"

got="$(kustomize_version "$TMP")"
if [[ "$got" != "$PINNED" ]]; then
  log "built binary reports version '$got', expected $PINNED"
  exit 1
fi
mv -f "$TMP" "$OUT"
trap - EXIT
log "built kustomize $got in $(( $(date +%s) - start ))s -> $OUT"
echo "$OUT"
