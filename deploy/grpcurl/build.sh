#!/usr/bin/env bash
# Build grpcurl (github.com/fullstorydev/grpcurl/cmd/grpcurl) from the Go module
# proxy, using the version pinned in deploy/grpcurl/go.mod + go.sum.
#
#   deploy/grpcurl/build.sh           -> prints the binary path on the last stdout line
#
# Output: $DS_CACHE_DIR/bin/grpcurl  (DS_CACHE_DIR defaults to $HOME/.cache/dataservice)
# Idempotent: if the binary exists and `grpcurl -version` reports the pinned
# version, it exits immediately. Set DS_FORCE_REBUILD=1 to rebuild anyway.
# Progress goes to stderr; stdout carries only the path.
#
# Env knobs: DS_CACHE_DIR, DS_FORCE_REBUILD, GOPROXY (default https://proxy.golang.org,direct),
#            GO (go binary, default `go` on PATH).
set -euo pipefail

log() { printf '[grpcurl/build] %s\n' "$*" >&2; }

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DS_CACHE_DIR="${DS_CACHE_DIR:-$HOME/.cache/dataservice}"
BIN_DIR="$DS_CACHE_DIR/bin"
OUT="$BIN_DIR/grpcurl"
GO="${GO:-go}"
MODULE="github.com/fullstorydev/grpcurl"
MAIN_PKG="$MODULE/cmd/grpcurl"

# Version pinned in go.mod (e.g. v1.9.4).
PINNED="$(awk -v m="$MODULE" '$1=="require" && $2==m {print $3}' "$SCRIPT_DIR/go.mod")"
if [[ -z "$PINNED" ]]; then
  PINNED="$(awk -v m="$MODULE" '$1==m {print $2; exit}' "$SCRIPT_DIR/go.mod")"
fi
[[ -n "$PINNED" ]] || { log "cannot find $MODULE in $SCRIPT_DIR/go.mod"; exit 1; }

# Prints "v1.9.4" for a grpcurl binary, or nothing. (`grpcurl -version` prints
# "<basename of argv0> v1.9.4" on stderr; accept either stream.)
grpcurl_version() {
  "$1" -version 2>&1 | awk 'NR==1 {print $2}' || true
}

is_good() {
  [[ -x "$1" ]] || return 1
  [[ "$(grpcurl_version "$1")" == "$PINNED" ]]
}

if [[ "${DS_FORCE_REBUILD:-0}" != "1" ]] && is_good "$OUT"; then
  log "up to date: $OUT (grpcurl $PINNED)"
  echo "$OUT"
  exit 0
fi

command -v "$GO" >/dev/null 2>&1 || { log "go toolchain not found (set GO=/path/to/go)"; exit 1; }
mkdir -p "$BIN_DIR"

# Serialise concurrent builds; re-check after acquiring the lock.
if command -v flock >/dev/null 2>&1; then
  exec 9>"$BIN_DIR/.grpcurl.build.lock"
  if ! flock -n 9; then
    log "another build holds $BIN_DIR/.grpcurl.build.lock; waiting"
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
# go.sum is committed and -mod=readonly refuses to change it: every module is
# verified against go.sum.
export GOFLAGS="-mod=readonly -buildvcs=false"
export CGO_ENABLED=0
mkdir -p "$GOMODCACHE" "$GOCACHE"

TMP="$(mktemp "$BIN_DIR/.grpcurl.tmp.XXXXXX")"
trap 'rm -f "$TMP"' EXIT

log "building $MAIN_PKG@$PINNED with $("$GO" version)"
start=$(date +%s)
# grpcurl reports main.version, which `go build` of a dependency leaves at its
# default ("dev build <no version set>"), so stamp the pinned version.
(
  cd "$SCRIPT_DIR"
  "$GO" build -trimpath -ldflags "-s -w -X main.version=$PINNED" -o "$TMP" "$MAIN_PKG" >&2
)
chmod 0755 "$TMP"

got="$(grpcurl_version "$TMP")"
if [[ "$got" != "$PINNED" ]]; then
  log "built binary reports version '$got', expected $PINNED"
  exit 1
fi
mv -f "$TMP" "$OUT"
trap - EXIT
log "built grpcurl $got in $(( $(date +%s) - start ))s -> $OUT"
echo "$OUT"
