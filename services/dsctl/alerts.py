"""``dsctl alerts``: per-caller alert templates on the notifier (put, list, delete)."""

from __future__ import annotations

import json
import uuid
from enum import StrEnum
from typing import Annotated

import grpc
import typer
from google.protobuf import json_format
from rich.console import Console
from rich.table import Table

from dataservice.common.v1 import common_pb2
from dataservice.notifier.v1 import notifier_pb2, notifier_pb2_grpc
from dsclient.connection import open_channel
from services.dsctl.admin_client import ExitCode, classify_rpc_error, notifier_endpoint
from services.dsctl.connection import connection
from services.runtime.faults import parse_severity, parse_type, short_severity, short_type

alerts_app = typer.Typer(
    help="Per-caller alert templates (rendered alerts for matching faults).",
    no_args_is_help=True,
)
console = Console()
err_console = Console(stderr=True)

NotifierOption = Annotated[
    str,
    typer.Option("--notifier", envvar="DS_NOTIFIER", help="Notifier gRPC HOST:PORT."),
]


class Output(StrEnum):
    table = "table"
    json = "json"


def _stub(address: str) -> tuple[grpc.Channel, notifier_pb2_grpc.NotifierServiceStub]:
    channel = open_channel(address, connection())
    return channel, notifier_pb2_grpc.NotifierServiceStub(channel)


def _fail(err: grpc.RpcError, address: str) -> typer.Exit:
    """The error on stderr and dsctl's documented exit code (see ``dsctl --help``)."""
    failure = classify_rpc_error(err, notifier_endpoint(address))
    err_console.print(f"[red]error:[/red] {failure.message}", highlight=False, soft_wrap=True)
    return typer.Exit(int(failure.exit_code))


def build_template(
    caller: str,
    name: str,
    *,
    open_text: str,
    resolved_text: str,
    groups: list[str],
    types: list[str],
    min_severity: str | None,
    interval: float,
    topic: str | None,
    webhook: str | None,
) -> notifier_pb2.AlertTemplate:
    """The AlertTemplate the flags describe (ValueError for an unknown type/severity)."""
    template = notifier_pb2.AlertTemplate(
        caller=caller,
        name=name,
        groups=groups,
        fault_types=[parse_type(t) for t in types],
        min_severity=(
            parse_severity(min_severity) if min_severity else common_pb2.SEVERITY_UNSPECIFIED
        ),
        open_template=open_text,
        resolved_template=resolved_text,
    )
    template.send_interval.FromNanoseconds(int(interval * 1e9))
    if webhook:
        template.webhook.url = webhook
    else:
        template.kafka.topic = topic or ""
    return template


@alerts_app.command("put")
def put(
    caller: Annotated[str, typer.Argument(help="Owner of the template (team or application).")],
    name: Annotated[str, typer.Argument(help="Template name, unique per caller.")],
    open_text: Annotated[
        str, typer.Option("--open", help='Jinja2 text for an OPEN fault, e.g. "{{ group }}".')
    ],
    resolved_text: Annotated[
        str, typer.Option("--resolved", help="Text when the fault resolves (empty = none).")
    ] = "",
    group: Annotated[
        list[str] | None, typer.Option("--group", "-g", help="Only these groups (repeat).")
    ] = None,
    fault_type: Annotated[
        list[str] | None,
        typer.Option("--type", "-t", help="Only these fault types, e.g. LAG_ERROR (repeat)."),
    ] = None,
    min_severity: Annotated[
        str | None, typer.Option("--min-severity", help="INFO, WARNING, ERROR or CRITICAL.")
    ] = None,
    interval: Annotated[
        float, typer.Option("--interval", min=0, help="Send interval in seconds (0 = all).")
    ] = 0.0,
    topic: Annotated[
        str | None, typer.Option("--topic", help="Kafka topic (default ds.alerts.<caller>).")
    ] = None,
    webhook: Annotated[
        str | None, typer.Option("--webhook", help="POST alerts to this http(s) URL instead.")
    ] = None,
    notifier: NotifierOption = "127.0.0.1:7090",
) -> None:
    """Create or replace an alert template."""
    try:
        template = build_template(
            caller,
            name,
            open_text=open_text,
            resolved_text=resolved_text,
            groups=group or [],
            types=fault_type or [],
            min_severity=min_severity,
            interval=interval,
            topic=topic,
            webhook=webhook,
        )
    except ValueError as exc:
        err_console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(int(ExitCode.ERROR)) from None
    channel, stub = _stub(notifier)
    with channel:
        try:
            response = stub.PutAlertTemplate(
                notifier_pb2.PutAlertTemplateRequest(
                    template=template, request_id=str(uuid.uuid4())
                ),
                timeout=20,
            )
        except grpc.RpcError as err:
            raise _fail(err, notifier) from None
    stored = response.template
    route = stored.webhook.url if stored.WhichOneof("route") == "webhook" else stored.kafka.topic
    console.print(f"stored {stored.caller}/{stored.name} → {route}")


@alerts_app.command("list")
def list_templates(
    caller: Annotated[str, typer.Option("--caller", help="Only this caller's templates.")] = "",
    output: Annotated[Output, typer.Option("--output", "-o")] = Output.table,
    notifier: NotifierOption = "127.0.0.1:7090",
) -> None:
    """List alert templates, ordered by caller and name."""
    channel, stub = _stub(notifier)
    with channel:
        try:
            response = stub.ListAlertTemplates(
                notifier_pb2.ListAlertTemplatesRequest(caller=caller), timeout=10
            )
        except grpc.RpcError as err:
            raise _fail(err, notifier) from None
    if output is Output.json:
        rows = [
            json_format.MessageToDict(t, preserving_proto_field_name=True)
            for t in response.templates
        ]
        console.print_json(json.dumps({"templates": rows}))
        return
    table = Table(title="alert templates")
    for column in ("caller", "name", "groups", "types", "min severity", "interval", "route"):
        table.add_column(column)
    for t in response.templates:
        route = t.webhook.url if t.WhichOneof("route") == "webhook" else f"kafka {t.kafka.topic}"
        table.add_row(
            t.caller,
            t.name,
            ",".join(t.groups) or "*",
            ",".join(short_type(x) for x in t.fault_types) or "*",
            short_severity(t.min_severity) if t.min_severity else "-",
            f"{t.send_interval.ToNanoseconds() / 1e9:g}s",
            route,
        )
    console.print(table)


@alerts_app.command("delete")
def delete(
    caller: Annotated[str, typer.Argument()],
    name: Annotated[str, typer.Argument()],
    notifier: NotifierOption = "127.0.0.1:7090",
) -> None:
    """Delete an alert template."""
    channel, stub = _stub(notifier)
    with channel:
        try:
            stub.DeleteAlertTemplate(
                notifier_pb2.DeleteAlertTemplateRequest(
                    caller=caller, name=name, request_id=str(uuid.uuid4())
                ),
                timeout=20,
            )
        except grpc.RpcError as err:
            raise _fail(err, notifier) from None
    console.print(f"deleted {caller}/{name}")
