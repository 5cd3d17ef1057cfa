#!/usr/bin/env bash
# Build the Kubernetes control plane the k8s tests run against (issue 40): kube-apiserver,
# kube-controller-manager and kubectl from k8s.io/kubernetes on the Go module proxy, at the
# version pinned in deploy/k8s-control-plane/go.mod (+ go.sum), with every k8s.io staging
# module pinned at the matching v0.33.x by replace directives (`go install` refuses
# k8s.io/kubernetes' own ./staging replaces, so a wrapper module is needed).
#
#   deploy/k8s-control-plane/build.sh     -> prints the binaries' directory on the last stdout line
#
# Output: $DS_CACHE_DIR/k8s/<version>/{kube-apiserver,kube-controller-manager,kubectl}
# (DS_CACHE_DIR defaults to $HOME/.cache/dataservice). Idempotent: if every binary exists and
# reports the pinned version, it exits at once. The cache is only ever a shortcut: with it
# empty the script builds everything (tens of minutes cold on 2 cores). Set
# DS_FORCE_REBUILD=1 to rebuild anyway. Builds run under `nice -n 19` with GOFLAGS -p
# (DS_GO_PARALLEL, default 2) so a shared machine stays usable.
# Progress goes to stderr; stdout carries only the path.
#
# Env knobs: DS_CACHE_DIR, DS_FORCE_REBUILD, DS_GO_PARALLEL, GOPROXY, GO.
set -euo pipefail

log() { printf '[k8s-control-plane/build] %s\n' "$*" >&2; }

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DS_CACHE_DIR="${DS_CACHE_DIR:-$HOME/.cache/dataservice}"
GO="${GO:-go}"
COMMANDS=(kube-apiserver kube-controller-manager kubectl)

VERSION="$(awk '$1=="require" && $2=="k8s.io/kubernetes" {print $3}' "$SCRIPT_DIR/go.mod")"
[[ -n "$VERSION" ]] || { log "cannot find k8s.io/kubernetes in $SCRIPT_DIR/go.mod"; exit 1; }
OUT_DIR="$DS_CACHE_DIR/k8s/$VERSION"

# Each command prints "Kubernetes v1.33.13" (kubectl: "Client Version: v1.33.13").
reports_version() {
  local bin="$1" printed
  [[ -x "$bin" ]] || return 1
  if [[ "$(basename "$bin")" == kubectl ]]; then
    printed="$("$bin" version --client 2>/dev/null | head -n1 || true)"
  else
    printed="$("$bin" --version 2>/dev/null | head -n1 || true)"
  fi
  [[ "$printed" == *" $VERSION" ]]
}

all_good() {
  local cmd
  for cmd in "${COMMANDS[@]}"; do reports_version "$OUT_DIR/$cmd" || return 1; done
}

if [[ "${DS_FORCE_REBUILD:-0}" != "1" ]] && all_good; then
  log "up to date: $OUT_DIR (Kubernetes $VERSION)"
  echo "$OUT_DIR"
  exit 0
fi

command -v "$GO" >/dev/null 2>&1 || { log "go toolchain not found (set GO=/path/to/go)"; exit 1; }
mkdir -p "$OUT_DIR"

# Serialise concurrent builds; re-check after acquiring the lock.
if command -v flock >/dev/null 2>&1; then
  exec 9>"$OUT_DIR/.build.lock"
  flock 9
  if [[ "${DS_FORCE_REBUILD:-0}" != "1" ]] && all_good; then
    log "built by a concurrent run: $OUT_DIR"
    echo "$OUT_DIR"
    exit 0
  fi
fi

export GOMODCACHE="$DS_CACHE_DIR/go/mod"
export GOCACHE="$DS_CACHE_DIR/go/build"
export GOPROXY="${GOPROXY:-https://proxy.golang.org,direct}"
# go.sum is committed and -mod=readonly refuses to change it: every module is verified.
export GOFLAGS="-mod=readonly -buildvcs=false -p=${DS_GO_PARALLEL:-2}"
export CGO_ENABLED=0
mkdir -p "$GOMODCACHE" "$GOCACHE"

# What hack/lib/version.sh stamps: without it the server reports v0.0.0-master and
# clients and the emulation-version check see a version that does not exist.
minor="${VERSION#v1.}"; minor="${minor%%.*}"
LDFLAGS="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  LDFLAGS+=" -X $pkg.gitVersion=$VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  LDFLAGS+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done

TMP_DIR="$(mktemp -d "$OUT_DIR/.tmp.XXXXXX")"
trap 'rm -rf "$TMP_DIR"' EXIT

start=$(date +%s)
for cmd in "${COMMANDS[@]}"; do
  if [[ "${DS_FORCE_REBUILD:-0}" != "1" ]] && reports_version "$OUT_DIR/$cmd"; then
    log "$cmd: up to date"
    continue
  fi
  log "building k8s.io/kubernetes/cmd/$cmd@$VERSION with $("$GO" version)"
  t0=$(date +%s)
  (
    cd "$SCRIPT_DIR"
    nice -n 19 "$GO" build -trimpath -ldflags "$LDFLAGS" -o "$TMP_DIR/$cmd" "k8s.io/kubernetes/cmd/$cmd" >&2
  )
  reports_version "$TMP_DIR/$cmd" || { log "$cmd does not report $VERSION"; exit 1; }
  mv -f "$TMP_DIR/$cmd" "$OUT_DIR/$cmd"
  log "built $cmd in $(( $(date +%s) - t0 ))s"
done
log "Kubernetes $VERSION in $(( $(date +%s) - start ))s -> $OUT_DIR"
echo "$OUT_DIR"
