"""The client's public surface (clients/python/README.md "Public surface",
docs/develop/python-client.md): ``dsclient.__all__`` is what both pages list, every name in
it is documented, and importing the client loads none of its extras (pyarrow, numpy,
py-consul) nor anything of the mesh's servers; ``stream_columns`` without pyarrow names the
extra to install."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
from pathlib import Path

import dsclient

PACKAGE = Path(__file__).resolve().parents[1]
README = PACKAGE / "README.md"
DOCS_PAGE = PACKAGE.parents[1] / "docs" / "develop" / "python-client.md"


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start : end if end >= 0 else len(text)]


def test_the_readme_table_lists_exactly_the_exported_names() -> None:
    table = _section(README.read_text(), "## Public surface")
    first_cells = re.findall(r"^\| ([^|]+) \|", table, flags=re.MULTILINE)
    listed = {name for cell in first_cells for name in re.findall(r"`([A-Za-z_]+)`", cell)}
    assert listed == set(dsclient.__all__)


def test_the_docs_page_names_every_exported_name() -> None:
    section = _section(DOCS_PAGE.read_text(), "## Public surface and compatibility")
    named = set(re.findall(r"`([A-Za-z_]+)`", section))
    assert set(dsclient.__all__) <= named, set(dsclient.__all__) - named


def test_every_exported_name_exists_and_is_documented() -> None:
    for name in dsclient.__all__:
        value = getattr(dsclient, name)
        documented = value if inspect.isclass(value) or callable(value) else type(value)
        assert inspect.getdoc(documented), f"dsclient.{name} has no docstring"


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )


def test_importing_the_client_loads_no_extra_and_nothing_of_the_servers() -> None:
    result = _python(
        "import sys, dsclient\n"
        "print(sorted({m.split('.')[0] for m in sys.modules}"
        " & {'services', 'spark', 'pyarrow', 'numpy', 'consul', 'structlog'}))"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_stream_columns_without_pyarrow_names_the_extra() -> None:
    # A None entry in sys.modules makes `import pyarrow` raise ImportError, as if it were
    # not installed; the check runs before any call to the mesh.
    result = _python(
        "import sys\n"
        "sys.modules['pyarrow'] = None\n"
        "from dsclient.client import _require_arrow\n"
        "try:\n"
        "    _require_arrow()\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    assert result.returncode == 0, result.stderr
    assert "pip install 'dataservice-client[arrow]'" in result.stdout
