"""``dsctl inject`` as an operator runs it: the README's sample gives the committed injected
manifest, which Kubernetes' schemas accept and which injecting again leaves byte for byte;
stdin to stdout; a workload that opts in without a group fails the run and writes nothing."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support import cli
from tests.support.k8s import EXAMPLES, validate

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SAMPLE = EXAMPLES / "app.yaml"
INJECTED = EXAMPLES / "app.injected.yaml"


def dsctl(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return cli.dsctl(*args, stdin=stdin, env=os.environ, timeout=60)


def test_the_readme_sample_gives_the_committed_injected_manifest(tmp_path: Path) -> None:
    out = tmp_path / "app.injected.yaml"
    result = dsctl("inject", "-f", str(SAMPLE), "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert "Deployment/orders-consumer: injected (group orders)" in result.stderr
    assert out.read_text() == INJECTED.read_text(), (
        "regenerate: dsctl inject -f deploy/k8s/examples/app.yaml "
        "-o deploy/k8s/examples/app.injected.yaml (and the README's diff)"
    )
    documents = list(yaml.safe_load_all(out.read_text()))
    assert [d["kind"] for d in documents] == ["Deployment", "Service"]
    assert [p for p in map(validate, documents) if p] == []


def test_injecting_the_output_again_changes_nothing() -> None:
    result = dsctl("inject", stdin=INJECTED.read_text())
    assert result.returncode == 0, result.stderr
    assert result.stdout == INJECTED.read_text()
    assert "Deployment/orders-consumer: unchanged (already injected)" in result.stderr


def test_a_workload_without_a_group_fails_and_nothing_is_written(tmp_path: Path) -> None:
    manifest = SAMPLE.read_text().replace("        dataservice.io/group: orders\n", "")
    out = tmp_path / "out.yaml"
    result = dsctl("inject", "-o", str(out), stdin=manifest)
    assert result.returncode == 1
    assert "no group" in result.stderr and not out.exists()
    with_flag = dsctl("inject", "--group", "billing", stdin=manifest)
    assert with_flag.returncode == 0, with_flag.stderr
    assert "Deployment/orders-consumer: injected (group billing)" in with_flag.stderr


def test_not_opted_in_unless_all(tmp_path: Path) -> None:
    manifest = SAMPLE.read_text().replace("        dataservice.io/inject: 'true'\n", "")
    plain = dsctl("inject", stdin=manifest)
    assert plain.returncode == 0 and "skipped" in plain.stderr
    assert plain.stdout == manifest
    forced = dsctl("inject", "--all", "--image", "reg/dataservice-mesh:0.1.0", stdin=manifest)
    assert forced.returncode == 0, forced.stderr
    (deployment, _service) = yaml.safe_load_all(forced.stdout)
    sidecar = deployment["spec"]["template"]["spec"]["initContainers"][0]
    assert sidecar["image"] == "reg/dataservice-mesh:0.1.0"


def test_bad_input_is_one_line() -> None:
    result = dsctl("inject", stdin="a: [unclosed\n")
    assert result.returncode == 1
    assert "not valid YAML" in result.stderr
