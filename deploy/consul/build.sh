#!/usr/bin/env bash
# Build the open-source (MPL-2.0) HashiCorp Consul agent, 1.14.x, from the Go
# module proxy, using the module pinned in deploy/consul/go.mod + go.sum.
#
#   deploy/consul/build.sh            -> prints the binary path on the last stdout line
#
# Output: $DS_CACHE_DIR/bin/consul   (DS_CACHE_DIR defaults to $HOME/.cache/dataservice)
# Idempotent: if the binary exists and `consul version` reports 1.14.x, it exits
# immediately. Set DS_FORCE_REBUILD=1 to rebuild anyway.
# Progress goes to stderr; stdout carries only the path.
#
# Env knobs: DS_CACHE_DIR, DS_FORCE_REBUILD, GOPROXY (default https://proxy.golang.org,direct),
#            GO (go binary, default `go` on PATH).
set -euo pipefail

log() { printf '[consul/build] %s\n' "$*" >&2; }

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DS_CACHE_DIR="${DS_CACHE_DIR:-$HOME/.cache/dataservice}"
BIN_DIR="$DS_CACHE_DIR/bin"
OUT="$BIN_DIR/consul"
GO="${GO:-go}"
MAIN_PKG="github.com/hashicorp/consul"
WANT_SERIES="1.14"

# Version pinned in go.mod (e.g. v1.14.11).
PINNED="$(awk '$1=="require" && $2=="github.com/hashicorp/consul" {print $3}' "$SCRIPT_DIR/go.mod")"
if [[ -z "$PINNED" ]]; then
  PINNED="$(awk '$1=="github.com/hashicorp/consul" {print $2; exit}' "$SCRIPT_DIR/go.mod")"
fi
[[ -n "$PINNED" ]] || { log "cannot find github.com/hashicorp/consul in $SCRIPT_DIR/go.mod"; exit 1; }

# Prints "1.14.11" for a consul binary, or nothing.
consul_version() {
  "$1" version 2>/dev/null | awk 'NR==1 && $1=="Consul" {sub(/^v/, "", $2); print $2}' || true
}

is_good() {
  [[ -x "$1" ]] || return 1
  local v
  v="$(consul_version "$1")"
  [[ "$v" == "$WANT_SERIES".* ]]
}

if [[ "${DS_FORCE_REBUILD:-0}" != "1" ]] && is_good "$OUT"; then
  log "up to date: $OUT (Consul v$(consul_version "$OUT"))"
  echo "$OUT"
  exit 0
fi

command -v "$GO" >/dev/null 2>&1 || { log "go toolchain not found (set GO=/path/to/go)"; exit 1; }
mkdir -p "$BIN_DIR"

# Serialise concurrent builds; re-check after acquiring the lock.
if command -v flock >/dev/null 2>&1; then
  exec 9>"$BIN_DIR/.consul.build.lock"
  if ! flock -n 9; then
    log "another build holds $BIN_DIR/.consul.build.lock; waiting"
    flock 9
  fi
  if [[ "${DS_FORCE_REBUILD:-0}" != "1" ]] && is_good "$OUT"; then
    log "built by a concurrent run: $OUT"
    echo "$OUT"
    exit 0
  fi
fi

export GOMODCACHE="$DS_CACHE_DIR/go/mod"
export GOCACHE="$DS_CACHE_DIR/go/build"
export GOPROXY="${GOPROXY:-https://proxy.golang.org,direct}"
# go.sum is committed and -mod=readonly refuses to change it, so every module is
# verified against go.sum; the checksum DB would only be consulted for entries
# missing from go.sum (which -mod=readonly turns into an error anyway).
export GOFLAGS="-mod=readonly -buildvcs=false"
export CGO_ENABLED=0
mkdir -p "$GOMODCACHE" "$GOCACHE"

TMP="$(mktemp "$BIN_DIR/.consul.tmp.XXXXXX")"
trap 'rm -f "$TMP"' EXIT

log "building $MAIN_PKG@$PINNED with $("$GO" version) (cold: ~10-12 min on 2 cores, ~1.8 GB RSS, ~2 GB module cache)"
log "GOMODCACHE=$GOMODCACHE GOCACHE=$GOCACHE"
start=$(date +%s)
(
  cd "$SCRIPT_DIR"
  "$GO" build -trimpath -ldflags "-s -w" -o "$TMP" "$MAIN_PKG" >&2
)
chmod 0755 "$TMP"

got="$(consul_version "$TMP")"
if [[ "$got" != "$WANT_SERIES".* ]]; then
  log "built binary reports version '$got', expected $WANT_SERIES.x"
  exit 1
fi
mv -f "$TMP" "$OUT"
trap - EXIT
log "built Consul v$got in $(( $(date +%s) - start ))s -> $OUT"
echo "$OUT"
