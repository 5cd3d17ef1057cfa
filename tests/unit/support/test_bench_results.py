"""A labelled benchmark run joins the file's other runs instead of overwriting them."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.bench_results import merge_labelled, write_result

WHEN = "2026-12-02T05:00:00+00:00"


def run(bench: str = "pod_cost", **tables: list[dict[str, int]]) -> dict[str, object]:
    return {"bench": bench, "command": "python bench.py", "results": tables}


def test_a_new_label_is_added_first_and_the_other_runs_stay() -> None:
    previous = {
        "bench": "pod_cost",
        "command": "old",
        "results": {"before: idle (t0)": [{"x": 1}], "before: by rate (t0)": [{"x": 2}]},
    }
    merged = merge_labelled(previous, run(idle=[{"x": 3}]), "after", WHEN)
    assert merged["command"] == "python bench.py"
    assert list(merged["results"]) == [
        f"after: idle ({WHEN})",
        "before: idle (t0)",
        "before: by rate (t0)",
    ]
    assert merged["results"][f"after: idle ({WHEN})"] == [{"x": 3}]


def test_a_run_under_a_label_already_there_replaces_only_that_runs_tables() -> None:
    previous = {
        "bench": "pod_cost",
        "results": {
            "A/B: main: idle (t0)": [{"x": 1}],  # the label "A/B: main", not "A/B"
            "A/B: idle (t0)": [{"x": 2}],
            "A/B: by rate (t0)": [{"x": 3}],
            "A/Bx: idle (t0)": [{"x": 4}],
        },
    }
    merged = merge_labelled(previous, run(idle=[{"x": 5}]), "A/B", WHEN)
    assert merged["results"] == {
        f"A/B: idle ({WHEN})": [{"x": 5}],
        "A/B: main: idle (t0)": [{"x": 1}],
        "A/Bx: idle (t0)": [{"x": 4}],
    }


def test_a_file_of_another_bench_or_of_unlabelled_rows_is_not_kept() -> None:
    other = {"bench": "balancer", "results": {"x: idle (t0)": []}}
    assert list(merge_labelled(other, run(idle=[]), "a", WHEN)["results"]) == [f"a: idle ({WHEN})"]
    flat = {"bench": "pod_cost", "results": [{"x": 1}]}
    assert list(merge_labelled(flat, run(idle=[]), "a", WHEN)["results"]) == [f"a: idle ({WHEN})"]
    assert list(merge_labelled(None, run(idle=[]), "a", WHEN)["results"]) == [f"a: idle ({WHEN})"]


def test_write_result_with_a_label_keeps_the_files_other_runs(tmp_path: Path) -> None:
    def write(label: str, x: int) -> dict[str, object]:
        path = write_result(
            "pod_cost", title="t", summary="s", load={}, results={"idle": [{"x": x}]},
            argv=["bench.py"], out_dir=tmp_path, label=label, when=f"t{x}",
        )  # fmt: skip
        data: dict[str, object] = json.loads(path.read_text())
        return data

    write("before", 1)
    write("after", 2)
    data = write("after", 3)
    assert data["results"] == {"after: idle (t3)": [{"x": 3}], "before: idle (t1)": [{"x": 1}]}
