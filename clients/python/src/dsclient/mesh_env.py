"""The environment through which an application finds the mesh inside its pod.

The injector (``dsctl inject`` and the admission webhook, services/injector/) writes these
variables into every application container of an injected pod; the client library reads them
(``DsClient.from_env()``). One module names them so both sides agree. The sidecar reads the
same ``DS_GROUP`` / ``DS_ASSIGNER`` / ``DS_CONSUL`` as its own settings (§9), so an
application and its sidecar are configured alike.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass

SIDECAR = "DS_SIDECAR"  # the pod's own sidecar, gRPC HOST:PORT (127.0.0.1:7080)
GROUP = "DS_GROUP"  # the consumer group the pod reads
ASSIGNER = "DS_ASSIGNER"  # assigner gRPC HOST:PORT the client binds through
CONSUL = "DS_CONSUL"  # Consul agent HOST:PORT: follow the assigner leader key (optional)
CLIENT_ID = "DS_CLIENT_ID"  # the application's client id (optional; default: the hostname)
# The directory of the pod's sidecar socket (a shared emptyDir), when the injector mounts
# one. The client needs no setting (the binding names the socket); this tells other tools
# (grpcurl, the Go and Java clients' users) where it is.
UDS_DIR = "DS_UDS_DIR"

DEFAULT_ASSIGNER = "127.0.0.1:7070"


@dataclass(frozen=True)
class MeshEnv:
    """What an application needs to reach the mesh, as the injected pod describes it."""

    group: str
    assigner: str
    consul: str | None
    sidecar: str | None
    client_id: str

    @classmethod
    def read(cls, environ: Mapping[str, str] | None = None) -> MeshEnv:
        """Read the variables; ``DS_GROUP`` is required (``KeyError`` naming it if unset).
        The client id defaults to the hostname, which Kubernetes sets to the pod name."""
        env = os.environ if environ is None else environ
        group = env.get(GROUP, "").strip()
        if not group:
            raise KeyError(f"{GROUP} is not set: is the dataservice sidecar injected?")
        return cls(
            group=group,
            assigner=env.get(ASSIGNER, "").strip() or DEFAULT_ASSIGNER,
            consul=env.get(CONSUL, "").strip() or None,
            sidecar=env.get(SIDECAR, "").strip() or None,
            client_id=env.get(CLIENT_ID, "").strip() or socket.gethostname(),
        )
