"""The import graph of app/, jobs/ and gpu/ has no circles: every module can be read after the modules
it imports (function-level and TYPE_CHECKING imports count too). The layering itself (app above
jobs above gpu, no CuPy in app or jobs) is import-linter's, in pyproject.toml."""

from __future__ import annotations

import grimp


def test_no_module_imports_itself_through_others():
    graph = grimp.build_graph("app", "jobs", "gpu")
    circles = set()
    for module in sorted(graph.modules):
        for imported in graph.find_modules_directly_imported_by(module):
            back = graph.find_shortest_chain(importer=imported, imported=module)
            if back:
                circles.add(" -> ".join((module, *back)))
    assert not circles, "\n".join(sorted(circles))
