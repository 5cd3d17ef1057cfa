"""``dsctl``: the operators' command line (ARCHITECTURE §5.5)."""

from __future__ import annotations

import json
import signal
import sys
import threading
from enum import StrEnum
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from typer import rich_utils

from services.dsctl import apply, config, dev, dlq, inject, operate, read
from services.dsctl.admin_client import EXIT_CODES_HELP, ExitCode
from services.dsctl.alerts import alerts_app

_CLICK_USAGE_ERROR = 2


class _Dsctl(typer.Typer):
    """The Typer app, with click's usage errors ending in exit status 1 (click's own 2
    means "not found" in dsctl's documented exit codes)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            result = super().__call__(*args, standalone_mode=False, **kwargs)
        except typer.TyperException as err:
            rich_utils.rich_format_error(err)  # type: ignore[arg-type]
            code = int(getattr(err, "exit_code", ExitCode.ERROR))
            sys.exit(int(ExitCode.ERROR) if code == _CLICK_USAGE_ERROR else code)
        except typer.Abort:
            rich_utils.rich_abort_error()
            sys.exit(int(ExitCode.ERROR))
        # Non-standalone click returns the exit code of typer.Exit, or the command's value.
        sys.exit(result if isinstance(result, int) else int(ExitCode.OK))


app = _Dsctl(
    name="dsctl",
    help=f"Operate the dataservice mesh.\n\n{EXIT_CODES_HELP}",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
read.register(app)
config.register(app)
operate.register(app)
inject.register(app)
apply.register(app)
dlq.register(app)
dev_app = typer.Typer(help="Run the whole mesh locally on real Kafka.", no_args_is_help=True)
app.add_typer(dev_app, name="dev")
app.add_typer(alerts_app, name="alerts")

console = Console()
err_console = Console(stderr=True)


class Output(StrEnum):
    table = "table"
    json = "json"


def _say(message: str) -> None:
    err_console.print(f"[dim]{message}[/dim]")


def _fail(message: str, code: int = 1) -> typer.Exit:
    err_console.print(f"[red]error:[/red] {message}")
    return typer.Exit(code)


@dev_app.command("up")
def dev_up(
    detach: Annotated[
        bool,
        typer.Option("--detach", "-d", help="Return once healthy; stop with `dsctl dev down`."),
    ] = False,
    sidecars: Annotated[int, typer.Option(min=1, max=20, help="How many sidecars.")] = 1,
    with_consul: Annotated[
        bool, typer.Option("--with-consul", help="Also run a Consul dev agent for discovery.")
    ] = False,
    kafka_port: Annotated[int, typer.Option(min=1, max=65535)] = 9092,
    producer_rate: Annotated[float, typer.Option(min=0.1, help="Demo records per second.")] = 20.0,
    spark_distribution: Annotated[
        bool,
        typer.Option(
            "--spark-distribution",
            help="Also run the Spark distribution/lag job on the demo group (report refreshed "
            "every minute).",
        ),
    ] = False,
    secure: Annotated[
        bool,
        typer.Option(
            "--secure",
            help="TLS and mTLS on every port, tokens and authorization: a development CA, "
            "certificates, tokens and a policy are made in the state directory's pki/.",
        ),
    ] = False,
) -> None:
    """Start Kafka, the assigner, sidecars, the notifier and a sample producer."""
    options = dev.UpOptions(
        sidecars=sidecars,
        kafka_port=kafka_port,
        with_consul=with_consul,
        producer_rate=producer_rate,
        spark_distribution=spark_distribution,
        secure=secure,
    )
    try:
        stack = dev.up(options, _say)
    except Exception as exc:
        raise _fail(str(exc)) from None
    _print_where_to_look(stack)
    if detach:
        return
    console.print("\n[bold]Running in the foreground; Ctrl-C stops everything.[/bold]")
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    dev.down_stack(stack, _say)
    console.print("stopped.")


@dev_app.command("status")
def dev_status(output: Annotated[Output, typer.Option("--output", "-o")] = Output.table) -> None:
    """What runs, with pids, ports and health. Exit 1 if nothing runs."""
    stack = dev.Stack.load()
    if stack is None:
        if output is Output.json:
            console.print_json(json.dumps({"running": False, "components": []}))
        else:
            err_console.print("no dev stack is running")
        raise typer.Exit(1)
    status = stack.status()
    status["running"] = any(c["running"] for c in status["components"])
    if output is Output.json:
        console.print_json(json.dumps(status))
    else:
        _status_table(status)
    if not status["running"]:
        raise typer.Exit(1)


@dev_app.command("down")
def dev_down() -> None:
    """Stop everything `dsctl dev up` started; leaves no process behind."""
    stack = dev.Stack.load()
    if stack is None:
        console.print("no dev stack is running")
        return
    killed = dev.down_stack(stack, _say)
    if killed:
        console.print(f"stopped (had to SIGKILL: {', '.join(killed)})")
    else:
        console.print("stopped.")


def _status_table(status: dict[str, Any]) -> None:
    table = Table(title=f"dev stack in {status['dir']}")
    for column in ("component", "pid", "running", "healthy", "grpc", "http"):
        table.add_column(column)
    for c in status["components"]:
        healthy = {True: "[green]SERVING[/green]", False: "[red]no[/red]", None: "-"}[c["healthy"]]
        table.add_row(
            c["name"],
            str(c["pid"]),
            "[green]yes[/green]" if c["running"] else "[red]no[/red]",
            healthy,
            c["grpc"] or "-",
            c["http"] or "-",
        )
    console.print(table)
    console.print(f"Kafka bootstrap: {status['bootstrap']}")


def _print_where_to_look(stack: dev.Stack) -> None:
    _status_table(stack.status())
    sidecar = next(c for c in stack.components if c.name.startswith("sidecar"))
    lines = [
        f"Kafka      {stack.bootstrap}  topic {dev.DEMO_TOPIC} ({dev.DEMO_PARTITIONS} partitions),"
        f" group {dev.DEMO_GROUP}",
        f"kafka-0    metrics http://127.0.0.1:{dev.KAFKA_METRICS_PORT}/metrics (JMX exporter)",
        "assigner   grpc 127.0.0.1:7070   metrics http://127.0.0.1:7071/metrics"
        "   views http://127.0.0.1:7071/ui",
        "notifier   grpc 127.0.0.1:7090   metrics http://127.0.0.1:7091/metrics",
        f"sidecar-0  grpc {sidecar.grpc}   metrics http://{sidecar.http}/metrics",
        f"logs       {stack.dir}/logs",
    ]
    if any(c.name == dev.PROBE_SIDECAR for c in stack.components):
        lines.append(
            f"probe      topic {dev.PROBE_TOPIC} via group {dev.PROBE_GROUP} "
            f"({dev.PROBE_SIDECAR} :{dev.PROBE_SIDECAR_PORTS[0]}); ds_probe_* on the notifier's "
            "metrics"
        )
    if stack.consul:
        lines.append(f"consul     http://{stack.consul}/ui")
    if any(c.name == dev.SPARK_DISTRIBUTION for c in stack.components):
        lines.append(f"spark      {dev.spark_report(stack)} (distribution and lag, every minute)")
    console.print("\n".join(lines))
    if stack.pki is not None:
        _print_secure_usage(stack.pki, sidecar.grpc or "127.0.0.1:7080")
        return
    console.print("\n[bold]Try:[/bold]")
    console.print("  grpcurl -plaintext 127.0.0.1:7070 list")
    console.print(
        '  grpcurl -plaintext -d \'{"client_id":"me","group":"demo","max_records":3}\' '
        f"{sidecar.grpc} dataservice.sidecar.v1.StreamService/Fetch"
    )
    console.print("  dsctl groups; dsctl lag demo; dsctl top; dsctl faults --follow")
    console.print("  dsctl dev status --output json")
    console.print("  dsctl dev down")


def _print_secure_usage(pki: str, sidecar: str) -> None:
    """--secure: how to reach the stack (the CA, the client certificate, a token)."""
    console.print(
        f"\n[bold]Secure:[/bold] mTLS on every port, tokens required. CA, certificates, "
        f"tokens and the policy are in {pki}/ (admin.jwt, viewer.jwt, reader-demo.jwt for "
        f"the assigner and the notifier; NAME.sidecar.jwt for sidecars: each service accepts "
        f"only tokens minted for it)."
    )
    console.print("[bold]Use dsctl (or an application) with:[/bold]")
    console.print(f"  export DS_TLS__CA_FILE={pki}/ca.pem DS_TLS__CERT_FILE={pki}/client.pem")
    console.print(f"  export DS_TLS__KEY_FILE={pki}/client.key DS_TLS__TOKEN_FILE={pki}/admin.jwt")
    console.print(f"  export DS_TLS__SIDECAR_TOKEN_FILE={pki}/admin.sidecar.jwt")
    console.print("[bold]Try:[/bold]")
    tls = f"-cacert {pki}/ca.pem -cert {pki}/client.pem -key {pki}/client.key"
    console.print(
        f'  grpcurl {tls} -H "authorization: Bearer $(cat {pki}/admin.jwt)" '
        "127.0.0.1:7070 dataservice.assigner.v1.AdminService/ListGroups"
    )
    console.print(
        f'  grpcurl {tls} -H "authorization: Bearer $(cat {pki}/reader-demo.sidecar.jwt)" '
        '-d \'{"client_id":"me","group":"demo","max_records":3}\' '
        f"{sidecar} dataservice.sidecar.v1.StreamService/Fetch"
    )
    console.print("  dsctl groups; dsctl lag demo; dsctl dev status --output json")
