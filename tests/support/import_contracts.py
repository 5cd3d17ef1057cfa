"""An import-linter contract type of the project's own (.importlinter, run by `make check`):
test modules import no other test module.

A helper two test modules share lives in tests/support (or a conftest), never in a
``test_*.py`` module: importing a test module runs its collection-time code again and
hides its helpers among tests. import-linter's own ``forbidden`` contract cannot say
"any module named ``test_*``" (a wildcard replaces a whole module name), hence this type."""

from __future__ import annotations

from grimp import ImportGraph
from importlinter import Contract, ContractCheck, fields, output


def is_test_module(module: str) -> bool:
    return module.rsplit(".", 1)[-1].startswith("test_")


class NoTestModuleImportsContract(Contract):
    """Configuration options:
    - packages: the packages whose ``test_*`` modules no module may import."""

    type_name = "no_test_module_imports"

    packages = fields.ListField(subfield=fields.StringField())

    def check(self, graph: ImportGraph, verbose: bool) -> ContractCheck:
        roots = [str(package) for package in self.packages]  # type: ignore[attr-defined]
        tests = sorted(
            module
            for root in roots
            for module in graph.find_descendants(root)
            if is_test_module(module)
        )
        broken = []
        for imported in tests:
            for importer in sorted(graph.find_modules_that_directly_import(imported)):
                details = graph.get_import_details(importer=importer, imported=imported)
                lines = sorted(d["line_number"] for d in details)
                broken.append({"importer": importer, "imported": imported, "lines": lines})
        return ContractCheck(
            kept=not broken, warnings=None, metadata={"broken": broken, "checked": len(tests)}
        )

    def render_broken_contract(self, check: ContractCheck) -> None:
        for item in check.metadata["broken"]:
            lines = ", ".join(f"l.{n}" for n in item["lines"])
            output.print_error(
                f"{item['importer']} imports the test module {item['imported']} ({lines}): "
                "move what it uses into tests/support."
            )
            output.new_line()
