"""MkDocs hooks (mkdocs.yml ``hooks:``): benchmark results rendered into pages at build time.

A page marks where results go with an HTML comment: ``<!-- benchmark-results -->`` renders
every ``docs/benchmarks/results/*.json``, ``<!-- benchmark-results: NAME -->`` only
``NAME.json``. A missing file renders as a note, never a build error (a benchmark that has
not run yet). The rendering is ``scripts/gen_docs.py``'s, so any result file renders: the
keys of the convention first, then a table per list of objects.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

_MARKER = re.compile(r"<!--\s*benchmark-results(?::\s*([\w.-]+))?\s*-->")
_GEN = Path(__file__).resolve().parent / "gen_docs.py"


def _gen_docs() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_docs", _GEN)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("gen_docs", module)
    spec.loader.exec_module(module)
    return module


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if "benchmark-results" not in markdown:
        return markdown
    gen = _gen_docs()
    results = Path(config["docs_dir"]) / "benchmarks" / "results"
    return _MARKER.sub(lambda m: gen.render_results(results, m.group(1), level=2), markdown)
