"""Render and validate deploy/k8s offline (``make k8s-check``, part of ``make check``).

Each overlay is rendered with the real kustomize (built from the Go module proxy by
deploy/kustomize/build.sh: the renderer ``kubectl apply -k`` embeds), and every rendered
document is validated, strictly (unknown fields are errors), against the schemas of
Kubernetes ``K8S_VERSION`` that the ``kubernetes-validate`` package ships. The examples are
validated too, and so is ``dsctl inject``'s output for them. Then what the manifests must
agree with elsewhere: the Prometheus rules copied into the base equal deploy/prometheus/rules,
the image tag is the project version, the injector's template is the default template.

    python -m tests.support.k8s check           # what make k8s-check runs
    python -m tests.support.k8s render dev      # print one rendered overlay
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml

from services.injector.patch import inject_documents
from services.injector.template import SidecarTemplate, package_version

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"
OVERLAYS = ("dev", "prod")
EXAMPLES = K8S / "examples"
# The newest Kubernetes whose schemas kubernetes-validate ships (1.37.0 has 1.37).
K8S_VERSION = "1.37.0"


def kustomize() -> Path:
    """The pinned kustomize binary, built on first use (about a minute, then cached)."""
    out = subprocess.run(
        ["bash", str(REPO / "deploy" / "kustomize" / "build.sh")],
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    ).stdout
    return Path(out.strip().splitlines()[-1])


def render(overlay: str | Path, binary: Path | None = None) -> list[dict[str, Any]]:
    """The documents ``kubectl apply -k`` would send for an overlay (name or directory)."""
    path = Path(overlay) if Path(overlay).is_dir() else K8S / "overlays" / str(overlay)
    result = subprocess.run(
        [str(binary or kustomize()), "build", str(path)],
        check=False,
        capture_output=True,
        text=True,
        env={**os.environ, "KUSTOMIZE_PLUGIN_HOME": "/nonexistent"},
    )
    if result.returncode != 0:
        raise RuntimeError(f"kustomize build {path} failed:\n{result.stderr}")
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc is not None]


def name_of(doc: dict[str, Any]) -> str:
    meta = doc.get("metadata") or {}
    namespace = f"{meta['namespace']}/" if meta.get("namespace") else ""
    return f"{doc.get('kind')} {namespace}{meta.get('name', '?')}"


def validate(doc: dict[str, Any]) -> str | None:
    """None if ``doc`` is valid for Kubernetes K8S_VERSION, else the problem."""
    try:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        where = "/".join(str(p) for p in exc.path) or "(document)"
        return f"{name_of(doc)}: {where}: {exc.message}"
    except (kubernetes_validate.SchemaNotFoundError, kubernetes_validate.InvalidSchemaError) as exc:
        return f"{name_of(doc)}: {exc}"
    return None


def load_file(path: Path) -> list[dict[str, Any]]:
    with path.open() as stream:
        return [doc for doc in yaml.safe_load_all(stream) if doc is not None]


def find(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    for doc in docs:
        if doc.get("kind") == kind and (doc.get("metadata") or {}).get("name", "").startswith(name):
            return doc
    raise LookupError(f"no {kind} {name}")


def consistency_problems(base: list[dict[str, Any]]) -> Iterator[str]:
    """What the rendered base must agree with outside deploy/k8s."""
    for rules in sorted((REPO / "deploy" / "prometheus" / "rules").glob("*.yml")):
        copy = K8S / "base" / "prometheus-rules" / rules.name
        if not copy.is_file() or copy.read_bytes() != rules.read_bytes():
            source, target = rules.relative_to(REPO), copy.relative_to(REPO)
            yield f"{target} differs from {source}: cp {source} {target}"
    image = f"dataservice-mesh:{package_version()}"
    for doc in base:
        if doc.get("kind") != "Deployment":
            continue
        for container in doc["spec"]["template"]["spec"]["containers"]:
            if container["image"] != image:
                yield f"{name_of(doc)} runs {container['image']}, not {image} (pyproject version)"
    template = yaml.safe_load(
        find(base, "ConfigMap", "ds-sidecar-template")["data"]["sidecar.yaml"]
    )
    if SidecarTemplate(**template) != SidecarTemplate():
        yield (
            "deploy/k8s/base/config/sidecar.yaml is not the template's defaults "
            "(services/injector/template.py): dsctl inject without --template would differ "
            "from the webhook"
        )


SOCKET_DIR = "/var/run/dataservice"


def check() -> int:
    binary = kustomize()
    problems: list[str] = []
    counts: list[str] = []
    for overlay in OVERLAYS:
        docs = render(overlay, binary)
        found = [p for p in map(validate, docs) if p]
        problems += [f"overlays/{overlay}: {p}" for p in found]
        counts.append(f"overlays/{overlay}: {len(docs)} documents")
    problems += list(consistency_problems(render(K8S / "base", binary)))
    prod = SidecarTemplate(
        **yaml.safe_load(
            find(render("prod", binary), "ConfigMap", "ds-sidecar-template")["data"]["sidecar.yaml"]
        )
    )
    for example in sorted(EXAMPLES.glob("*.yaml")):
        docs = load_file(example)
        injected, _ = inject_documents(docs, SidecarTemplate())
        # ... and with the sidecar's socket volume (template uds_dir).
        with_socket, _ = inject_documents(docs, SidecarTemplate(uds_dir=SOCKET_DIR))
        # ... and with prod's template (workload identity: tokens, the sidecar's auth).
        with_prod, _ = inject_documents(docs, prod)
        found = [p for p in map(validate, docs + injected + with_socket + with_prod) if p]
        problems += [f"examples/{example.name}: {p}" for p in found]
        counts.append(
            f"examples/{example.name}: {len(docs)} documents (+ injected, + with uds_dir, "
            "+ with prod's template)"
        )
    for line in counts:
        print(f"k8s-check: {line}, validated against Kubernetes {K8S_VERSION} (strict)")
    for problem in problems:
        print(f"k8s-check: {problem}", file=sys.stderr)
    if problems:
        print(f"k8s-check: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    print("k8s-check: ok")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.k8s")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("check", help="render every overlay and validate everything")
    show = sub.add_parser("render", help="print one rendered overlay")
    show.add_argument("overlay", choices=OVERLAYS)
    args = parser.parse_args(argv)
    if args.command == "render":
        print(yaml.safe_dump_all(render(args.overlay), sort_keys=False), end="")
        return 0
    return check()


if __name__ == "__main__":
    sys.exit(main())
