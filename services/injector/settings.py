"""Injector settings (flags > DS_* env > YAML file > defaults)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from services.runtime.settings import DsSettings, OneLineArgumentParser


class InjectorSettings(DsSettings):
    host: str = Field("127.0.0.1", description="address the HTTPS server binds to")
    port: int = Field(8443, ge=0, le=65535, description="HTTPS port (0 = pick a free one)")
    cert_file: Path = Field(
        description="serving certificate (PEM, chain first); reloaded on change"
    )
    key_file: Path = Field(description="its private key (PEM); reloaded on change")
    template_file: Path | None = Field(
        None, description="sidecar template YAML (services/injector/template.py); unset = defaults"
    )
    # json (one object a line, for log collectors) or console (for people).
    log_format: Literal["json", "console"] = "json"
    # The lowest level logged.
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    @model_validator(mode="after")
    def _files_exist(self) -> InjectorSettings:
        for name in ("cert_file", "key_file", "template_file"):
            path = getattr(self, name)
            if path is not None and not path.is_file():
                raise ValueError(f"{name} {str(path)!r} is not a readable file")
        return self


def parser() -> OneLineArgumentParser:
    p = OneLineArgumentParser(
        prog="ds-injector",
        description="Mutating admission webhook: injects the dataservice sidecar into pods.",
    )
    p.add_argument("--host", help="bind address (DS_HOST)")
    p.add_argument("--port", help="HTTPS port (DS_PORT)")
    p.add_argument("--cert-file", dest="cert_file", help="serving certificate (DS_CERT_FILE)")
    p.add_argument("--key-file", dest="key_file", help="its key (DS_KEY_FILE)")
    p.add_argument("--template", dest="template_file", help="sidecar template (DS_TEMPLATE_FILE)")
    p.add_argument("--log-format", dest="log_format", help="json | console (DS_LOG_FORMAT)")
    p.add_argument("--log-level", dest="log_level", help="(DS_LOG_LEVEL)")
    p.add_argument("--config", help="YAML settings file (DS_CONFIG)")
    return p
