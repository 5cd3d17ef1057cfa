"""The generated reference pages are current, a change in the code makes them stale, and
benchmark results render whatever their shape (scripts/gen_docs.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scripts import gen_docs


def test_committed_reference_pages_are_current(capsys: pytest.CaptureFixture[str]) -> None:
    assert gen_docs.check() == 0, capsys.readouterr().out


def test_a_renamed_metric_makes_the_metric_page_stale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    committed = tmp_path / "reference"
    gen_docs.write(committed)
    monkeypatch.setattr(gen_docs, "REFERENCE", committed)
    assert gen_docs.check() == 0
    page = committed / "metrics.md"
    page.write_text(page.read_text().replace("ds_assigner_heartbeats_total", "ds_assigner_beats"))
    assert gen_docs.check() == 1
    out = capsys.readouterr().out
    assert "metrics.md" in out and "scripts/gen_docs.py" in out


def test_every_settings_field_has_a_row_with_its_variable() -> None:
    from services.consumer_sidecar.settings import SidecarSettings

    rows = {row.key: row for row in gen_docs.setting_rows(SidecarSettings)}
    assert set(SidecarSettings.model_fields) <= set(rows)
    assert rows["tls.ca_file"].env == "DS_TLS__CA_FILE"
    assert rows["auth.enabled"].env == "DS_AUTH__ENABLED"


def test_an_unseen_results_file_renders_a_table_per_result_set(tmp_path: Path) -> None:
    (tmp_path / "pod_cost.json").write_text(
        json.dumps(
            {
                "bench": "pod_cost",
                "date": "2026-12-01T00:00:00Z",
                "command": "python tests/bench/bench_pod_cost.py",
                "machine": {"cpus": 2},
                "results": {
                    "cpu": [{"path": "sidecar", "cpu_per_record_us": 3.1, "ratio": 1.4}],
                    "memory": [{"process": "sidecar", "rss_mib": 150}],
                },
                "extra": [{"a": 1}, {"b": 2}],
            }
        )
    )
    text = gen_docs.render_results(tmp_path)
    assert sum(line.startswith("| ---") for line in text.splitlines()) == 3
    assert "| path | cpu_per_record_us | ratio |" in text
    assert "| a | b |" in text and "python tests/bench/bench_pod_cost.py" in text


def test_a_missing_results_file_is_a_note_not_an_error(tmp_path: Path) -> None:
    assert "No results yet" in gen_docs.render_results(tmp_path / "absent")
    assert "pod_cost.json" in gen_docs.render_results(tmp_path, only="pod_cost")
