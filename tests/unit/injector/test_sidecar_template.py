"""The sidecar template (services/injector/template.py): defaults, file, overrides, errors."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from services.injector.template import SidecarTemplate, load_template, package_version
from services.runtime.settings import ConfigError


def test_defaults_name_the_project_image_and_the_base_install() -> None:
    template = SidecarTemplate()
    assert template.image == f"dataservice-mesh:{package_version()}"
    assert template.assigner == "ds-assigner.dataservice.svc:7070"
    assert (template.grpc_port, template.http_port) == (7080, 7081)
    assert template.termination_grace_seconds > template.handoff_timeout_seconds


def test_file_then_overrides(tmp_path: Path) -> None:
    path = tmp_path / "sidecar.yaml"
    path.write_text(
        "image: reg/dataservice-mesh:1.2.3\nbootstrap: k1:9092, k2:9092\n"
        "consul: $(HOST_IP):8500\nenv:\n  DS_BUFFER_MAX_BYTES: '134217728'\n"
    )
    template = load_template(path, image=None, assigner="a.example:7070")
    assert template.image == "reg/dataservice-mesh:1.2.3"
    assert template.bootstrap == "k1:9092,k2:9092"
    assert template.consul == "$(HOST_IP):8500"
    assert template.assigner == "a.example:7070"
    assert template.env == {"DS_BUFFER_MAX_BYTES": "134217728"}


def test_workload_identity_over_tcp_needs_a_serving_certificate() -> None:
    """A sidecar with TLS on its TCP port may take tokens there: no socket needed."""
    env = {"DS_TLS__CERT_FILE": "/tls/tls.crt", "DS_TLS__KEY_FILE": "/tls/tls.key"}
    template = SidecarTemplate(workload_identity=True, listen_host="0.0.0.0", env=env)
    assert template.serves_tls and template.uds_dir is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("assigner: nowhere\n", "assigner"),
        ("bootstrap: ''\n", "bootstrap"),
        ("grpc_port: 70000\n", "grpc_port"),
        ("env:\n  PATH: /bin\n", "only DS_* settings"),
        ("handoff_timeout_seconds: 60\n", "must exceed handoff_timeout_seconds"),
        ("ca_config_map: ds-ca\n", "it needs workload_identity"),
        ("workload_identity: true\ntoken_expiration_seconds: 60\n", "token_expiration_seconds"),
        ("workload_identity: true\n", "set uds_dir"),
        (
            "workload_identity: true\nuds_dir: /run/ds\nlisten_host: 0.0.0.0\n",
            "listen_host must be loopback",
        ),
        ("imagee: x\n", "imagee"),
        ("- a list\n", "must hold a mapping"),
    ],
)
def test_bad_templates_name_the_setting(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "sidecar.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_template(path)
