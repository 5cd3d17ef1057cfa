"""``dsctl inject`` and ``dsctl handoff``: the sidecar in Kubernetes workloads.

``inject`` reads a multi-document manifest (a file or stdin), adds the sidecar to every
Deployment, StatefulSet and Job that opts in (services/injector/patch.py, the same patch the
admission webhook applies), and writes the manifest (a file or stdout); other documents pass
through as they are. What happened to each workload goes to stderr. A workload that opts in
but names no group fails the whole run (exit 1, nothing written).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any, TextIO

import typer
import yaml
from rich.console import Console

from services.dsctl import handoff as handoff_
from services.dsctl.admin_client import DEFAULT_ASSIGNER, EXIT_CODES_HELP, CliError, ExitCode
from services.dsctl.read import reflowed
from services.injector.patch import Action, Result, inject_documents
from services.injector.template import load_template
from services.runtime.settings import ConfigError

err_console = Console(stderr=True)

_STYLE = {
    Action.INJECTED: "green",
    Action.UPDATED: "yellow",
    Action.UNCHANGED: "dim",
    Action.SKIPPED: "dim",
    Action.FAILED: "red",
}


def read_documents(stream: TextIO) -> list[Any]:
    """Every non-empty YAML document of ``stream``, in order."""
    return [doc for doc in yaml.safe_load_all(stream) if doc is not None]


def dump_documents(documents: list[Any]) -> str:
    """Documents as multi-document YAML, keys in their order, long strings not folded."""
    return yaml.safe_dump_all(documents, sort_keys=False, width=1_000_000)


def inject(
    filename: Annotated[
        str,
        typer.Option("--filename", "-f", help="Manifest to inject: a YAML file, or - for stdin."),
    ] = "-",
    out: Annotated[
        Path | None,
        typer.Option("--out", "-o", help="Write here instead of stdout.", dir_okay=False),
    ] = None,
    group: Annotated[
        str | None,
        typer.Option(help="Group for workloads that do not annotate dataservice.io/group."),
    ] = None,
    all_workloads: Annotated[
        bool,
        typer.Option(
            "--all",
            help="Inject workloads that do not opt in too (those with dataservice.io/inject: "
            '"false" stay as they are), as a namespace labelled for the webhook does.',
        ),
    ] = False,
    template: Annotated[
        Path | None,
        typer.Option(
            help="Sidecar template YAML (the ds-sidecar-template ConfigMap's sidecar.yaml); "
            "default: deploy/k8s/base's values.",
            exists=True,
            dir_okay=False,
        ),
    ] = None,
    image: Annotated[
        str | None, typer.Option(help="Sidecar image (overrides the template).")
    ] = None,
    bootstrap: Annotated[
        str | None, typer.Option(help="Kafka bootstrap servers of the sidecar (overrides).")
    ] = None,
    assigner: Annotated[
        str | None,
        typer.Option(help="Assigner HOST:PORT the sidecar and the application use (overrides)."),
    ] = None,
) -> None:
    """Add the dataservice sidecar to Kubernetes workloads (like istioctl kube-inject).

    Reads Deployments, StatefulSets and Jobs (multi-document YAML; other kinds pass through
    unchanged) and injects those whose pod template or workload carries the annotation or
    label dataservice.io/inject: "true" (or all but opted-out ones with --all): the sidecar
    as a native sidecar (an init container with restartPolicy Always), DS_SIDECAR, DS_GROUP
    and DS_ASSIGNER in each application container, probes, a preStop hand-off and a
    terminationGracePeriodSeconds that covers it. Injecting again changes nothing.
    """
    try:
        sidecar = load_template(template, image=image, bootstrap=bootstrap, assigner=assigner)
    except ConfigError as exc:
        raise _fail(str(exc)) from None
    try:
        if filename == "-":
            documents = read_documents(sys.stdin)
        else:
            with Path(filename).open() as stream:
                documents = read_documents(stream)
    except OSError as exc:
        raise _fail(f"cannot read {filename}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise _fail(f"{filename} is not valid YAML: {str(exc).splitlines()[0]}") from None
    injected, results = inject_documents(
        documents, sidecar, default=all_workloads, fallback_group=group
    )
    _report(results)
    if any(r.action is Action.FAILED for r in results):
        raise _fail("nothing written: every workload that opts in needs a group")
    text = dump_documents(injected)
    if out is None:
        sys.stdout.write(text)
    else:
        out.write_text(text)


def _report(results: list[Result]) -> None:
    if not results:
        err_console.print("[dim]no Deployment, StatefulSet or Job in the input[/dim]")
    for r in results:
        style = _STYLE[r.action]
        err_console.print(f"[{style}]{r.name}: {r.action.value}[/{style}] ({r.reason})")


def _fail(message: str) -> typer.Exit:
    err_console.print(f"[red]error:[/red] {message}")
    return typer.Exit(int(ExitCode.ERROR))


def handoff(
    sidecar: Annotated[
        str, typer.Option(help="The sidecar's gRPC HOST:PORT (in its pod: 127.0.0.1:7080).")
    ] = "127.0.0.1:7080",
    assigner: Annotated[
        str, typer.Option(envvar="DS_ASSIGNER", help="Assigner gRPC HOST:PORT (any replica).")
    ] = DEFAULT_ASSIGNER,
    timeout: Annotated[
        float, typer.Option(min=0.0, help="Seconds to wait for the partitions to go.")
    ] = 15.0,
) -> None:
    """Hand a running sidecar's leases off and wait until it holds none.

    The preStop hook of an injected sidecar: the sidecar leaves its group through the
    assigner, which revokes its leases; it drains in-flight acks, commits and releases each
    partition while still serving. Exit 0 once it holds none (or has nothing to hand off), 3
    if the sidecar or the assigner cannot be reached or the time is up (SIGTERM then releases
    what is left).
    """
    try:
        handoff_.handoff(sidecar, assigner, timeout, lambda m: err_console.print(m))
    except CliError as err:
        err_console.print(f"[red]error:[/red] {err.message}")
        raise typer.Exit(int(err.exit_code)) from None


def register(app: typer.Typer) -> None:
    """Adds ``inject`` and ``handoff`` to the ``dsctl`` app."""
    for name, command in (("inject", inject), ("handoff", handoff)):
        app.command(name, help=reflowed(command.__doc__), epilog=EXIT_CODES_HELP)(command)
