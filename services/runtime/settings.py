"""Settings every service shares, and how they are loaded.

Precedence (highest first): command-line flags, ``DS_*`` environment variables (nested with
``__``), the YAML file named by ``--config`` / ``DS_CONFIG``, then defaults. Models are frozen
and loaded once in ``__main__``; nothing reads settings from globals. A bad value ends the
process with one line naming the setting — see :func:`load_or_exit`.
"""

from __future__ import annotations

import argparse
import contextvars
import ipaddress
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, NoReturn, TypeVar

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from dsclient.addresses import parse_host_port
from dsclient.connection import DEFAULT_SETTINGS, PLAINTEXT, ConnectionSettings, TlsConfig
from services.runtime.auth.settings import AuthSettings

# The parsed YAML file of the load in progress (a context variable, not a global setting:
# it only exists while load_settings() builds one model).
_yaml_data: contextvars.ContextVar[Mapping[str, Any] | None] = contextvars.ContextVar(
    "ds_yaml_settings", default=None
)


class ConfigError(Exception):
    """A configuration problem, reported to the operator as one line."""


class _YamlSource(PydanticBaseSettingsSource):
    """Reads the YAML file parsed by :func:`load_settings` (lowest precedence)."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return (_yaml_data.get() or {}).get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(_yaml_data.get() or {})


class DsSettings(BaseSettings):
    """How every ds-* process reads its settings: ``DS_*`` variables (nested with ``__``) over
    the YAML file, frozen, unknown keys refused. :class:`ServiceSettings` adds what the gRPC
    services share; a process that is not one of them (the injector) builds on this."""

    model_config = SettingsConfigDict(
        env_prefix="DS_",
        env_nested_delimiter="__",
        frozen=True,
        extra="forbid",
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, _YamlSource(settings_cls))


class ServiceSettings(DsSettings):
    """What every ds-* service is configured with (ARCHITECTURE §9)."""

    bootstrap: str = Field(
        "127.0.0.1:9092", description="Kafka bootstrap servers, HOST:PORT[,HOST:PORT...]"
    )
    consul: str | None = Field(
        None, description="Consul agent HTTP address HOST:PORT; unset = static discovery"
    )
    notifier: str | None = Field(
        None,
        description="notifier HOST:PORT for fault reports; unset = a healthy ds-notifier "
        "from Consul when --consul is set, else faults are only logged",
    )
    host: str = Field("127.0.0.1", description="address the gRPC and HTTP servers bind to")
    advertise_host: str | None = Field(
        None, description="address other services use to reach this one (default: host)"
    )
    grpc_port: int = Field(0, ge=0, le=65535, description="gRPC port (0 = pick a free one)")
    http_port: int = Field(0, ge=0, le=65535, description="HTTP port for /metrics and /healthz")
    # json (one object a line, for log collectors) or console (for people: dsctl dev).
    log_format: Literal["json", "console"] = "json"
    # The lowest level logged.
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    kafka: dict[str, str] = Field(
        default_factory=dict, description="librdkafka settings passed through as they are"
    )
    # On SIGTERM: how long in-flight RPCs may finish after the service leaves Consul and drains,
    # before the gRPC server stops them.
    shutdown_grace_seconds: float = Field(5.0, ge=0, le=300)
    dependency_retry_max_seconds: float = Field(
        10.0, gt=0, le=300, description="cap of the backoff between dependency checks"
    )
    tls: TlsConfig = Field(
        PLAINTEXT,
        description="TLS of this service's gRPC and HTTP servers and of its own client "
        "channels (DS_TLS__CA_FILE, __CERT_FILE, __KEY_FILE, __CLIENT_AUTH, __TOKEN_FILE)",
    )
    auth: AuthSettings = Field(
        default_factory=AuthSettings,
        description="authentication and the policy (DS_AUTH__ENABLED, __POLICY_FILE, ...)",
    )

    def tokens_only_on_socket(self) -> bool:
        """Whether, with auth on and no TLS, callers may still be authenticated: on a Unix
        domain socket only (tokens never cross a network; its TCP port then refuses every
        call but health checks). No for a service in general; the sidecar says yes when it
        serves its pod's socket and listens on loopback only (its settings)."""
        return False

    @model_validator(mode="after")
    def _auth_needs_tls(self) -> ServiceSettings:
        if self.auth.enabled and not self.tls.server_enabled and not self.tokens_only_on_socket():
            raise ValueError(
                "auth.enabled needs tls.cert_file and tls.key_file: tokens are never sent "
                "in the clear (a sidecar may instead serve uds_dir with host on loopback)"
            )
        if (
            self.auth.enabled
            and self.auth.identity_from == "certificate"
            and (self.tls.client_auth != "require")
        ):
            raise ValueError("auth.identity_from=certificate needs tls.client_auth=require")
        return self

    @property
    def connection(self) -> ConnectionSettings:
        """How this service's own clients (its session, reporter, probe) reach the mesh."""
        return DEFAULT_SETTINGS.with_tls(self.tls)

    @field_validator("bootstrap")
    @classmethod
    def _valid_bootstrap(cls, value: str) -> str:
        parts = [p.strip() for p in value.split(",") if p.strip()]
        if not parts:
            raise ValueError("bootstrap must name at least one HOST:PORT")
        for part in parts:
            parse_host_port(part, what="bootstrap server")
        return ",".join(parts)

    @field_validator("notifier")
    @classmethod
    def _valid_notifier(cls, value: str | None) -> str | None:
        if value in (None, ""):
            return None
        assert value is not None
        parse_host_port(value, what="notifier address")
        return value

    @field_validator("consul")
    @classmethod
    def _valid_consul(cls, value: str | None) -> str | None:
        if value in (None, ""):
            return None
        assert value is not None
        address = value.removeprefix("http://")
        parse_host_port(address, what="consul address")
        return address

    @property
    def advertised(self) -> str:
        return self.advertise_host or self.host


S = TypeVar("S", bound=DsSettings)


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address to bind) is loopback only: 127.0.0.0/8, ::1, localhost."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}".splitlines()[0]) from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of settings")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def load_settings(cls: type[S], flags: Mapping[str, Any], config_file: Path | None) -> S:
    """Build ``cls`` from flags > env > YAML file > defaults; raise ConfigError on bad input."""
    data = read_yaml(config_file) if config_file else {}
    token = _yaml_data.set(data)
    try:
        return cls(**{k: v for k, v in flags.items() if v is not None})
    except ValidationError as exc:
        raise ConfigError(_one_line(exc)) from exc
    finally:
        _yaml_data.reset(token)


def _one_line(exc: ValidationError) -> str:
    problems = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "settings"
        message = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            message = "unknown setting"
        got = err.get("input")
        suffix = (
            f" (got {got!r})"
            if got is not None and err["type"] != "extra_forbidden" and not isinstance(got, dict)
            else ""
        )
        problems.append(f"{where}: {message}{suffix}")
    return "invalid configuration: " + "; ".join(problems)


class OneLineArgumentParser(argparse.ArgumentParser):
    """argparse that reports a bad flag as one line and exit code 2, never a usage dump."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def base_parser(prog: str, description: str) -> OneLineArgumentParser:
    """The flags every service takes (ARCHITECTURE §9); each also reads a DS_* variable."""
    parser = OneLineArgumentParser(prog=prog, description=description)
    parser.add_argument("--bootstrap", help="Kafka bootstrap servers (DS_BOOTSTRAP)")
    parser.add_argument("--consul", help="Consul HTTP address; absent = static (DS_CONSUL)")
    parser.add_argument("--notifier", help="notifier HOST:PORT for faults (DS_NOTIFIER)")
    parser.add_argument("--grpc-port", dest="grpc_port", help="gRPC port (DS_GRPC_PORT)")
    parser.add_argument("--http-port", dest="http_port", help="HTTP port (DS_HTTP_PORT)")
    parser.add_argument("--host", help="bind address (DS_HOST)")
    parser.add_argument("--advertise-host", dest="advertise_host", help="(DS_ADVERTISE_HOST)")
    parser.add_argument("--log-format", dest="log_format", help="json | console (DS_LOG_FORMAT)")
    parser.add_argument("--log-level", dest="log_level", help="(DS_LOG_LEVEL)")
    parser.add_argument("--config", help="YAML settings file (DS_CONFIG)")
    return parser


def load_or_exit(
    cls: type[S], parser: argparse.ArgumentParser, argv: Sequence[str] | None = None
) -> S:
    """Parse flags and load settings; on any problem print one line and exit 2."""
    args = vars(parser.parse_args(argv))
    config = args.pop("config", None) or os.environ.get("DS_CONFIG")
    try:
        return load_settings(cls, args, Path(config) if config else None)
    except ConfigError as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
