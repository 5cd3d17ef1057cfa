"""The container images of the mesh and its compose stack, built from nothing and cached.

No image registry is reachable, so the base is a Debian root filesystem made by
``mmdebstrap --variant=minbase`` and turned into an image by ``podman import``; every image
is FROM it (deploy/container/):

* ``dataservice-mesh``: every service (``Containerfile``), installed from wheels of the
  project and its dependencies that pip builds on the host (from its own cache), so the
  image build needs no package index;
* ``dataservice-kafka``: Debian's JRE and the jars of deploy/kafka/pom.xml;
* ``dataservice-consul``: the agent deploy/consul/build.sh builds;
* ``dataservice-monitoring``: Debian's Prometheus and Alertmanager.

An image's content is tagged with a hash of its inputs (its Containerfile, the files of its
build context, the base) and saved to ``$DS_CACHE_DIR/images/NAME-HASH.tar``: when the
inputs did not change, the image is found in podman's storage or loaded from that tarball
instead of built (only the newest tarball of each image is kept). The version and commit
labels go on top in a build that adds no layer (label.Containerfile), which also tags
``NAME:dev`` and ``NAME:VERSION``; so a new commit that changes no input rebuilds nothing.

    python -m services.devstack.images            # build or load every image, with timings
    python -m services.devstack.images mesh kafka # only these
"""

from __future__ import annotations

import argparse
import hashlib
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from services.devstack import podman
from services.devstack.cache import cache_dir, file_lock
from services.devstack.consul import consul_binary
from services.devstack.kafka import (
    JMX_EXPORTER_RULES,
    LOG4J2_CONFIG,
    ensure_jmx_exporter_agent,
    ensure_kafka_jars,
    kafka_version,
)

REPO = podman.REPO
CONTAINER_DIR = REPO / "deploy" / "container"
# The base root filesystem: Debian 12, the "minbase" variant (Essential packages and apt).
BASE_NAME = "dataservice-base"
BASE_SUITE = "bookworm"
MMDEBSTRAP_ARGS = ("--variant=minbase", BASE_SUITE)
# What the mesh image is built from: hashed, so a change to any of them rebuilds it.
MESH_SOURCES = ("pyproject.toml", "README.md", "services", "spark", "clients/python")


@dataclass(frozen=True)
class ImageSpec:
    """One image: where its Containerfile is, what its content depends on, how its build
    context is filled (only when it is built), and the version its label carries."""

    key: str  # short name on the command line
    name: str  # image name, tagged NAME:dev and NAME:VERSION
    containerfile: str  # file name under deploy/container/
    inputs: Callable[[], list[Path]]
    prepare: Callable[[Path], None]
    version: Callable[[], str]


@dataclass(frozen=True)
class Outcome:
    name: str
    ref: str  # the content image, NAME:HASH
    how: str  # "present" | "loaded" | "built"
    seconds: float


def images_dir() -> Path:
    return cache_dir() / "images"


def digest(parts: Iterable[bytes]) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return h.hexdigest()[:16]


def _file_parts(paths: Iterable[Path]) -> Iterable[bytes]:
    for path in sorted(paths):
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for file in files:
            yield str(file.relative_to(path.parent) if path.is_dir() else file.name).encode()
            yield file.read_bytes()


# ---- the base -------------------------------------------------------------------------


def ensure_base() -> Outcome:
    """The imported Debian base: in podman's storage, else from the cached rootfs tarball,
    else made with mmdebstrap (a few minutes, the packages come from Debian's mirror)."""
    started = time.monotonic()
    key = digest([" ".join(MMDEBSTRAP_ARGS).encode()])
    ref = f"localhost/{BASE_NAME}:{key}"
    if _exists(ref):
        return Outcome(BASE_NAME, ref, "present", time.monotonic() - started)
    tar = images_dir() / f"{BASE_NAME}-{key}.tar"
    with file_lock(images_dir() / f"{BASE_NAME}.lock"):
        how = "loaded"
        if not tar.is_file():
            how = "built"
            podman.require("mmdebstrap")
            # mmdebstrap picks its output format from the name's extension: keep ".tar".
            partial = tar.with_name(f".{tar.stem}.partial.tar")
            podman.run(["mmdebstrap", *MMDEBSTRAP_ARGS, str(partial)], timeout=1800)
            partial.rename(tar)
            _prune(BASE_NAME, keep=tar)
        podman.podman("import", str(tar), ref, timeout=600)
    return Outcome(BASE_NAME, ref, how, time.monotonic() - started)


# ---- the images -----------------------------------------------------------------------


def ensure_image(spec: ImageSpec, base: Outcome) -> Outcome:
    """``spec``'s content image for these inputs: present, loaded from the cache or built."""
    started = time.monotonic()
    containerfile = CONTAINER_DIR / spec.containerfile
    key = digest(
        [
            spec.name.encode(),
            base.ref.encode(),
            containerfile.read_bytes(),
            *_file_parts(spec.inputs()),
        ]
    )
    ref = f"localhost/{spec.name}:{key}"
    if _exists(ref):
        return Outcome(spec.name, ref, "present", time.monotonic() - started)
    tar = images_dir() / f"{spec.name}-{key}.tar"
    with file_lock(images_dir() / f"{spec.name}.lock"):
        if tar.is_file():
            podman.podman("load", "--quiet", "--input", str(tar), timeout=600)
            return Outcome(spec.name, ref, "loaded", time.monotonic() - started)
        with tempfile.TemporaryDirectory(prefix=f"ds-image-{spec.key}-") as tmp:
            context = Path(tmp)
            spec.prepare(context)
            shutil.copy(containerfile, context / "Containerfile")
            # INPUTS: the content hash, which a Containerfile declares (ARG) before a RUN
            # whose input is a bind mount: podman's layer cache does not look into the
            # mount, and reused the old layer (the old wheels) after a source change.
            _build(context, ref, {"BASE": base.ref, "INPUTS": key})
        partial = tar.with_name(f".{tar.stem}.partial.tar")
        partial.unlink(missing_ok=True)
        podman.podman("save", "--format", "docker-archive", "--output", str(partial), ref)
        partial.rename(tar)
        _prune(spec.name, keep=tar)
    return Outcome(spec.name, ref, "built", time.monotonic() - started)


def label(spec: ImageSpec, content: Outcome) -> list[str]:
    """Tag ``content`` as NAME:dev and NAME:VERSION with the version and commit labels."""
    version = spec.version()
    tags = [f"localhost/{spec.name}:dev", f"localhost/{spec.name}:{version}"]
    args = {"IMAGE": content.ref, "VERSION": version, "REVISION": revision(), "TITLE": spec.name}
    with tempfile.TemporaryDirectory(prefix="ds-image-label-") as tmp:
        shutil.copy(CONTAINER_DIR / "label.Containerfile", Path(tmp) / "Containerfile")
        _build(Path(tmp), tags[0], args, more_tags=tags[1:])
    return tags


def _build(
    context: Path, tag: str, build_args: dict[str, str], more_tags: Sequence[str] = ()
) -> None:
    # Docker format: the OCI format has no HEALTHCHECK. Host network: the RUN steps reach
    # Debian's mirror without a bridge.
    argv = ["build", "--format", "docker", "--network", "host", "--tag", tag]
    for more in more_tags:
        argv += ["--tag", more]
    for name, value in build_args.items():
        argv += ["--build-arg", f"{name}={value}"]
    podman.podman(*argv, "--file", str(context / "Containerfile"), str(context), timeout=1800)


def _exists(ref: str) -> bool:
    return (
        podman.run([podman.require("podman"), "image", "exists", ref], check=False).returncode == 0
    )


def _prune(name: str, keep: Path) -> None:
    """Only the newest tarball of an image stays in the cache."""
    for old in images_dir().glob(f"{name}-*.tar"):
        if old != keep:
            old.unlink(missing_ok=True)


def _remove_stale(name: str, keep: str) -> None:
    """Remove the images of older inputs (NAME:<hash>) and the labelled images that lost
    their tags to a newer build, so rebuilds do not pile up in podman's storage. An image a
    container still uses stays (podman refuses to remove it)."""
    podman.podman(
        "image", "prune", "--force", "--filter", f"label=org.opencontainers.image.title={name}",
        check=False,
    )  # fmt: skip
    listed = podman.podman("images", "--format", "{{.Repository}}:{{.Tag}}", f"localhost/{name}")
    for ref in listed.split():
        if ref != keep and re.fullmatch(rf"localhost/{name}:[0-9a-f]{{16}}", ref):
            podman.podman("rmi", ref, check=False)


def revision() -> str:
    """The commit the images are built from, ``-dirty`` when tracked files differ from it."""

    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=False)

    head = git("rev-parse", "HEAD").stdout.strip() or "unknown"
    return head if git("diff", "--quiet", "HEAD").returncode == 0 else f"{head}-dirty"


# ---- what each image is made of ----------------------------------------------------------


def project_version() -> str:
    return str(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"])


def _mesh_inputs() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z", *MESH_SOURCES],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    files = [REPO / name for name in listed.split("\0") if name and (REPO / name).is_file()]
    return [*files, CONTAINER_DIR / "entrypoint.sh", CONTAINER_DIR / "healthcheck.py"]


def _mesh_context(context: Path) -> None:
    # The project's wheel, the client's (clients/python, a dependency pip finds nowhere else)
    # and every other dependency's (the operator extra's too: ds-operator runs from the same
    # image), from pip's cache when it has them.
    podman.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--wheel-dir", str(context / "wheels"),
         str(REPO / "clients" / "python"), f"{REPO}[operator]"],
        timeout=1200,
    )  # fmt: skip
    for name in ("entrypoint.sh", "healthcheck.py"):
        shutil.copy(CONTAINER_DIR / name, context / name)


def _kafka_inputs() -> list[Path]:
    return [
        ensure_kafka_jars(),
        LOG4J2_CONFIG,
        CONTAINER_DIR / "kafka-entrypoint.sh",
        ensure_jmx_exporter_agent(),
        JMX_EXPORTER_RULES,
    ]


def _kafka_context(context: Path) -> None:
    libs = context / "libs"
    libs.mkdir()
    for jar in ensure_kafka_jars().glob("*.jar"):
        shutil.copy(jar, libs / jar.name)
    shutil.copy(LOG4J2_CONFIG, context / "log4j2.properties")
    shutil.copy(CONTAINER_DIR / "kafka-entrypoint.sh", context / "kafka-entrypoint.sh")
    # The Prometheus JMX exporter agent and its rules (KAFKA_METRICS_PORT turns it on).
    jmx = context / "jmx"
    jmx.mkdir()
    shutil.copy(ensure_jmx_exporter_agent(), jmx / "jmx_prometheus_javaagent.jar")
    shutil.copy(JMX_EXPORTER_RULES, jmx / "jmx-exporter.yml")


def consul_version() -> str:
    go_mod = (REPO / "deploy" / "consul" / "go.mod").read_text()
    match = re.search(r"github\.com/hashicorp/consul v([0-9][^\s]*)", go_mod)
    return match.group(1) if match else "unknown"


def _consul_context(context: Path) -> None:
    shutil.copy(consul_binary(), context / "consul")


IMAGES: dict[str, ImageSpec] = {
    spec.key: spec
    for spec in (
        ImageSpec("mesh", "dataservice-mesh", "Containerfile", _mesh_inputs, _mesh_context,
                  project_version),
        ImageSpec("kafka", "dataservice-kafka", "kafka.Containerfile", _kafka_inputs,
                  _kafka_context, kafka_version),
        ImageSpec("consul", "dataservice-consul", "consul.Containerfile",
                  lambda: [consul_binary()], _consul_context, consul_version),
        ImageSpec("monitoring", "dataservice-monitoring", "monitoring.Containerfile",
                  lambda: [], lambda _context: None, lambda: BASE_SUITE),
    )
}  # fmt: skip


def ensure_images(
    keys: Sequence[str] = tuple(IMAGES), report: Callable[[str], None] = print
) -> list[Outcome]:
    """Build or load the named images (all by default) and tag them; report each step."""
    started = time.monotonic()
    base = ensure_base()
    report(f"images: {base.name} {base.how} in {base.seconds:.1f}s")
    outcomes = [base]
    for key in keys:
        spec = IMAGES[key]
        step = time.monotonic()
        content = ensure_image(spec, base)
        tags = label(spec, content)
        _remove_stale(spec.name, keep=content.ref)
        outcome = Outcome(spec.name, content.ref, content.how, time.monotonic() - step)
        outcomes.append(outcome)
        report(f"images: {spec.name} {outcome.how} in {outcome.seconds:.1f}s -> {', '.join(tags)}")
    report(f"images: total {time.monotonic() - started:.1f}s")
    return outcomes


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m services.devstack.images")
    parser.add_argument("images", nargs="*", help=f"of {', '.join(IMAGES)} (default: all)")
    args = parser.parse_args(argv)
    if unknown := sorted(set(args.images) - set(IMAGES)):
        parser.error(f"unknown image(s) {', '.join(unknown)}")
    try:
        ensure_images(args.images or tuple(IMAGES))
    except podman.PodmanError as exc:
        print(f"images: {exc}", file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
