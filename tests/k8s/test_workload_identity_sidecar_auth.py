"""The injected sidecar verifies its application's token, end to end as far as a cluster
without a kubelet goes. The prod overlay's template, served by a local injector that the
API server calls through the manifests' webhook configuration: a Pod created in an
opted-in namespace is *stored* with the sidecar configured to verify (DS_AUTH__*, its auth
volume, the socket). Then a real sidecar process runs with exactly the environment the
stored spec gives it, each projected file written as the kubelet would (tokens from the
API server's TokenRequest, ``kubectl create token`` bound to the stored Pod; ConfigMaps
read back from the API server), only the in-cluster addresses mapped to where things run
here (the API server, the shared Kafka, a real assigner with TLS, free ports, a short
socket directory). The application's calls go through the client library on the pod's
socket with the application container's stored environment."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from confluent_kafka import Producer
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dataservice.sidecar.v1 import stream_pb2, stream_pb2_grpc
from dsclient import local_socket
from dsclient.connection import DEFAULT_SETTINGS, TlsConfig, open_channel
from services.devstack import kube, procs
from services.devstack.kafka import create_topic
from services.devstack.pki import DevPki, make_dev_pki
from services.devstack.ports import free_ports
from services.injector.patch import SIDECAR_AUTH_VOLUME, SIDECAR_NAME
from tests.k8s.conftest import Injector, get_json, wait_for
from tests.support.mesh import Mesh

pytestmark = [pytest.mark.timeout(300)]

NAMESPACE = "wid-verify"  # labelled dataservice.io/inject=true
ACCOUNT = "orders-consumer"
SUBJECT = f"system:serviceaccount:{NAMESPACE}:{ACCOUNT}"
API_SERVER = "https://kubernetes.default.svc"
RUN = uuid.uuid4().hex[:8]
GROUP = f"wid-orders-{RUN}"
TOPIC = f"wid-orders-{RUN}"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def assigner_pki(tmp_path_factory: pytest.TempPathFactory) -> DevPki:
    """The assigner's certificate and the CA that signs it (what ds-ca distributes)."""
    return make_dev_pki(tmp_path_factory.mktemp("wid-pki"), {}, certificates=["assigner"])


@pytest.fixture(scope="module")
def namespace(cluster: kube.Cluster, assigner_pki: DevPki) -> None:
    """An opted-in namespace with the two ConfigMaps prod's template needs: ds-ca and the
    sidecars' policy (orders-consumer reads the group; stranger nothing)."""
    manifest = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": NAMESPACE, "labels": {"dataservice.io/inject": "true"}},
    }
    cluster.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(manifest))
    for account in (ACCOUNT, "stranger"):
        cluster.kubectl("create", "serviceaccount", account, "-n", NAMESPACE)
    cluster.kubectl("create", "configmap", "ds-ca", "-n", NAMESPACE,
                    f"--from-file=ca.crt={assigner_pki.ca}")  # fmt: skip
    policy = yaml.safe_dump({"identities": {SUBJECT: [f"reader:{GROUP}"]}})
    cluster.kubectl("create", "configmap", "ds-sidecar-policy", "-n", NAMESPACE,
                    f"--from-literal=policy.yaml={policy}")  # fmt: skip
    wait_for(
        lambda: ACCOUNT in cluster.kubectl("get", "sa", ACCOUNT, "-n", NAMESPACE, check=False),
        f"service account {NAMESPACE}/{ACCOUNT}",
    )


def create_pod(cluster: kube.Cluster, *, dry_run: bool = False) -> dict[str, Any]:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "orders-consumer-",
            "namespace": NAMESPACE,
            "annotations": {"dataservice.io/group": GROUP},
        },
        "spec": {
            "serviceAccountName": ACCOUNT,
            "containers": [{"name": "app", "image": "registry.example/shop/orders:2.3.1"}],
        },
    }
    args = cluster.argv("create", "-f", "-", "-o", "json")
    if dry_run:
        args.append("--dry-run=server")
    done = subprocess.run(args, input=json.dumps(pod), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    created: dict[str, Any] = json.loads(done.stdout)
    return created


def container(spec: dict[str, Any], name: str) -> dict[str, Any]:
    every = [*spec.get("initContainers", []), *spec["containers"]]
    return next(c for c in every if c["name"] == name)


class Kubelet:
    """What the kubelet would do for the stored pod, here: write each projected volume's
    files (tokens by TokenRequest bound to the pod, ConfigMaps as stored) into a local
    directory per mount, and resolve a container's env (fieldRefs, $(VAR) references)."""

    def __init__(self, cluster: kube.Cluster, stored: dict[str, Any], root: Path) -> None:
        self.cluster, self.stored, self.root = cluster, stored, root
        self.name = stored["metadata"]["name"]

    def token(self, account: str, audience: str | None, *, bound: bool = True) -> str:
        args = ["create", "token", account, "-n", NAMESPACE, "--duration=10m"]
        if audience is not None:
            args.append(f"--audience={audience}")
        if bound:
            args += ["--bound-object-kind=Pod", f"--bound-object-name={self.name}"]
        return self.cluster.kubectl(*args).strip()

    def config_map(self, name: str) -> dict[str, str]:
        found: dict[str, str] = get_json(self.cluster, "configmap", name, "-n", NAMESPACE)["data"]
        return found

    def write_volume(self, volume: dict[str, Any]) -> Path:
        directory: Path = self.root / str(volume["name"])
        directory.mkdir(parents=True)
        for source in volume["projected"]["sources"]:
            if "serviceAccountToken" in source:
                token = source["serviceAccountToken"]
                text = self.token(self.stored["spec"]["serviceAccountName"], token.get("audience"))
                (directory / token["path"]).write_text(text)
            for item in source.get("configMap", {}).get("items", []):
                data = self.config_map(source["configMap"]["name"])
                (directory / item["path"]).write_text(data[item["key"]])
        return directory

    def env(self, entries: list[dict[str, Any]], fields: dict[str, str]) -> dict[str, str]:
        resolved: dict[str, str] = {}
        for entry in entries:
            if "valueFrom" in entry:
                resolved[entry["name"]] = fields[entry["valueFrom"]["fieldRef"]["fieldPath"]]
                continue
            value = re.sub(
                r"\$\((\w+)\)", lambda m: resolved.get(m.group(1), m.group(0)), entry["value"]
            )
            resolved[entry["name"]] = value
        return resolved


def mapped(env: dict[str, str], paths: dict[str, str]) -> dict[str, str]:
    """``env`` with each mount path replaced by where its files are here."""
    out = {}
    for name, value in env.items():
        for inside, here in paths.items():
            value = value.replace(inside, here)
        out[name] = value
    return out


def fetch(target: str, tls: TlsConfig, wait_ms: int = 0) -> tuple[str, str, int]:
    """(status code, its message, records) of one Fetch of the group."""
    request = stream_pb2.FetchRequest(group=GROUP, client_id="app-1", max_records=100)
    request.max_wait.FromMilliseconds(wait_ms)
    with open_channel(target, DEFAULT_SETTINGS.with_tls(tls)) as channel:
        try:
            got = stream_pb2_grpc.StreamServiceStub(channel).Fetch(request, timeout=20)
            return "OK", "", len(got.records)
        except grpc.RpcError as err:
            return err.code().name, str(err.details()), 0


@pytest.fixture
def socket_root() -> Iterator[Path]:
    """The pod's socket volume here: short (a socket path has at most 107 bytes)."""
    directory = Path(tempfile.mkdtemp(prefix="wid", dir="/tmp"))
    try:
        yield directory
    finally:
        subprocess.run(["rm", "-rf", str(directory)], check=False)


def test_the_injected_sidecar_verifies_its_application_s_token(
    cluster: kube.Cluster,
    prod_injector: Injector,
    namespace: None,
    assigner_pki: DevPki,
    kafka_cluster: Any,
    tmp_path: Path,
    socket_root: Path,
) -> None:
    wait_for(
        lambda: any(
            c["name"] == SIDECAR_NAME
            for c in create_pod(cluster, dry_run=True)["spec"].get("initContainers") or []
        ),
        "the webhook configuration in effect",
    )
    name = create_pod(cluster)["metadata"]["name"]
    stored = get_json(cluster, "pod", name, "-n", NAMESPACE)  # read back, as stored
    spec = stored["spec"]
    sidecar, app = container(spec, SIDECAR_NAME), container(spec, "app")
    stored_env = {e["name"]: e.get("value") for e in sidecar["env"]}
    assert stored_env["DS_AUTH__ENABLED"] == "true"
    assert stored_env["DS_AUTH__IDENTITY_FROM"] == "token"
    keys = json.loads(stored_env["DS_AUTH__SERVICE_ACCOUNT_KEYS"])
    assert keys["server"] == API_SERVER and keys["issuer"] == API_SERVER
    assert "DS_TLS__CERT_FILE" not in stored_env and stored_env["DS_HOST"] == "127.0.0.1"
    [auth_volume] = [v for v in spec["volumes"] if v["name"] == SIDECAR_AUTH_VOLUME]
    assert SIDECAR_AUTH_VOLUME in {m["name"] for m in sidecar["volumeMounts"]}
    assert SIDECAR_AUTH_VOLUME not in {m["name"] for m in app["volumeMounts"]}
    assert not [v for v in spec["volumes"] if "secret" in v]  # no Secret holds a token
    auth_env = {k: v for k, v in stored_env.items() if k.startswith("DS_AUTH__")}
    print(f"\nstored pod {NAMESPACE}/{name}: sidecar env {json.dumps(auth_env)}")
    print(f"  volume {SIDECAR_AUTH_VOLUME}: {json.dumps(auth_volume['projected'])}")

    # The kubelet's part: the projected files, per mount.
    kubelet = Kubelet(cluster, stored, tmp_path / "volumes")
    paths = {}
    for volume in spec["volumes"]:
        if "projected" in volume and volume["name"].startswith("ds-"):
            here = kubelet.write_volume(volume)
            for mount in sidecar["volumeMounts"]:
                if mount["name"] == volume["name"]:
                    paths[mount["mountPath"]] = str(here)
    paths[stored_env["DS_UDS_DIR"]] = str(socket_root)

    # Where the in-cluster names are here: the API server, Kafka, the assigner, ports.
    bootstrap = kafka_cluster.bootstrap
    create_topic(bootstrap, TOPIC, 1)
    producer = Producer({"bootstrap.servers": bootstrap})
    mesh = Mesh(bootstrap, tmp_path / "logs")
    (tmp_path / "logs").mkdir()
    tls = {
        "DS_TLS__CA_FILE": str(assigner_pki.ca),
        "DS_TLS__CERT_FILE": str(assigner_pki.cert("assigner")),
        "DS_TLS__KEY_FILE": str(assigner_pki.key("assigner")),
    }
    sidecar_proc: Any = None
    try:
        assigner = mesh.assigner([(GROUP, [TOPIC])], env=tls)
        fields = {"metadata.name": name, "status.podIP": "127.0.0.1", "status.hostIP": "127.0.0.1"}
        env = mapped(kubelet.env(sidecar["env"], fields), paths)
        grpc_port, http_port = free_ports(2)
        # Its files as mapped above; the API server where it runs here.
        keys = {**json.loads(env["DS_AUTH__SERVICE_ACCOUNT_KEYS"]), "server": cluster.server}
        env.update(
            DS_BOOTSTRAP=bootstrap,
            DS_ASSIGNER=assigner.grpc_addr,
            DS_GRPC_PORT=str(grpc_port),
            DS_HTTP_PORT=str(http_port),
            DS_LOG_FORMAT="console",
            DS_AUTH__SERVICE_ACCOUNT_KEYS=json.dumps(keys),
        )
        env.pop("DS_NOTIFIER")  # none runs here: faults are logged
        changed = sorted(k for k in env if env[k] != stored_env.get(k))
        print(f"  sidecar process: the stored env; resolved (fieldRefs, $(VAR)) or mapped here: "
              f"{', '.join(changed)}")  # fmt: skip
        base = {k: v for k, v in os.environ.items() if not k.startswith("DS_")}
        sidecar_proc = procs.spawn(
            [sys.executable, "-m", "services.consumer_sidecar"],
            tmp_path / "logs" / "sidecar.log",
            cwd=REPO,
            env={**base, **env},
        )
        socket = (
            socket_root
            / local_socket.sidecar_directory_name(name)
            / local_socket.sidecar_file_name(name)
        )
        unix = local_socket.target(socket)
        # The application: its stored env (the ds-sidecar token it sends its sidecar).
        app_env = mapped(kubelet.env(app["env"], fields), paths)
        app_tls = TlsConfig.from_env(app_env).for_sidecars()
        assert app_tls.token_file is not None and app_tls.token_file.name == "sidecar-token"

        def joined_and_read() -> tuple[str, str, int] | None:
            assert sidecar_proc.poll() is None, (tmp_path / "logs" / "sidecar.log").read_text()
            if not socket.exists():
                return None
            got = fetch(unix, app_tls, wait_ms=1000)
            if got[0] == "OK" and got[2] == 0:  # joined; where the group starts: records after
                producer.produce(TOPIC, value=b"order")
                assert producer.flush(30) == 0
            return got if got[0] == "OK" and got[2] > 0 else None

        code, _, records = wait_for(joined_and_read, "the sidecar joined, records fetched", 120)
        print(f"  {SUBJECT} (pod {name}, audience ds-sidecar, its socket): Fetch -> "
              f"{code}, {records} records")  # fmt: skip
        others = tmp_path / "others"
        others.mkdir()
        for who, token, expected in (
            ("stranger (audience ds-sidecar)", kubelet.token("stranger", "ds-sidecar", bound=False),
             "PERMISSION_DENIED"),
            (f"{ACCOUNT} (audience ds-assigner)", kubelet.token(ACCOUNT, "ds-assigner"),
             "UNAUTHENTICATED"),
            ("(no token)", None, "UNAUTHENTICATED"),
        ):  # fmt: skip
            tls_of = TlsConfig()
            if token is not None:
                path = others / f"{len(list(others.iterdir()))}.jwt"
                path.write_text(token)
                tls_of = TlsConfig(token_file=path)
            code, why, _ = fetch(unix, tls_of)
            print(f"  {who}: Fetch -> {code}: {why}")
            assert code == expected, why
        # Its TCP port: health for the probes; a token sent there in the clear is refused.
        tcp = f"127.0.0.1:{grpc_port}"
        app_token = Path(app_tls.token_file).read_text()
        with grpc.insecure_channel(tcp) as channel:
            health = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=10
            )
            request = stream_pb2.FetchRequest(group=GROUP, client_id="app-1")
            with pytest.raises(grpc.RpcError) as refused:
                stream_pb2_grpc.StreamServiceStub(channel).Fetch(
                    request, metadata=(("authorization", f"Bearer {app_token}"),), timeout=10
                )
        assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED
        print(f"  TCP {tcp} (no TLS): Health -> "
              f"{health_pb2.HealthCheckResponse.ServingStatus.Name(health.status)}; "
              f"Fetch with the application's token -> {refused.value.code().name}: "
              f"{refused.value.details()}")  # fmt: skip
        # The stored preStop hook, run as the kubelet would: in the sidecar's container, with
        # its env. It asks the sidecar for its Status on the socket (its ds-sidecar token)
        # and the assigner to let it leave, and waits until it holds nothing.
        hook = sidecar["lifecycle"]["preStop"]["exec"]["command"]
        assert hook[:3] == ["python", "-m", "services.dsctl.handoff"] and "--sidecar" not in hook
        done = subprocess.run(
            [sys.executable, *hook[1:]],
            env={**base, **env},
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
        said = " / ".join(done.stderr.strip().splitlines())
        print(f"  preStop {' '.join(hook[2:])}: exit {done.returncode}: {said}")
        assert done.returncode == 0, done.stderr
        assert "handed every partition off" in done.stderr
    finally:
        if sidecar_proc is not None:
            procs.terminate(sidecar_proc)
        mesh.stop_all()
