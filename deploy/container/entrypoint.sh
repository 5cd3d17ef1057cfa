#!/bin/sh
# The image's entry point: the first argument names the service, the rest are its flags.
# Every service also reads its DS_* environment variables, as outside a container.
#   podman run dataservice-mesh:dev assigner --consul 127.0.0.1:8500
#   podman run dataservice-mesh:dev dsctl groups --output json
# exec: the service is PID 1 and gets SIGTERM itself (each installs its own handler).
set -eu

usage() {
  cat <<'USAGE'
usage: ds-entrypoint SERVICE [FLAGS...]
  assigner   ds-assigner: the control plane
  sidecar    ds-sidecar: the consumer sidecar of an application pod
  notifier   ds-notifier: fault events and alerts
  dsctl      the operators' CLI
  injector   the sidecar-injection admission webhook
  operator   ds-operator: reconciles DsGroup resources (Kubernetes)
  demo-app   ds-demo-app: a sample application that binds, fetches, acks and counts
Each takes --help.
USAGE
}

# DS_PLAINTEXT=1: a developer's opt-in to plaintext (`python -m services.devstack.compose up
# --plaintext`): every DS_TLS__* and DS_AUTH__* variable is dropped before the service
# starts, so it serves without TLS, tokens or authorization whatever else set them.
if [ "${DS_PLAINTEXT:-0}" = 1 ]; then
  for var in $(env | sed -n 's/^\(DS_TLS__[A-Z0-9_]*\|DS_AUTH__[A-Z0-9_]*\)=.*/\1/p'); do
    unset "$var"
  done
fi

service="${1:-help}"
[ "$#" -gt 0 ] && shift
case "$service" in
  assigner) exec ds-assigner "$@" ;;
  sidecar) exec ds-sidecar "$@" ;;
  notifier) exec ds-notifier "$@" ;;
  dsctl) exec dsctl "$@" ;;
  injector) exec ds-injector "$@" ;;
  operator) exec ds-operator "$@" ;;
  demo-app) exec ds-demo-app "$@" ;;
  help | -h | --help) usage ;;
  *)
    echo "ds-entrypoint: unknown service '$service'" >&2
    usage >&2
    exit 64
    ;;
esac
