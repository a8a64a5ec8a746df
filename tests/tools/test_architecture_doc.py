"""docs/architecture.md stays true: every module, folder and test it names exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
PATH = re.compile(r"(?:lmi_handlers|lmi_tools|tests)/[\w/]*(?:\.py|/)")
IN_DIAGRAM = re.compile(r"(?<![\w/])((?:lmi_handlers|lmi_tools)/[\w/]*/|[a-z_][\w/]*\.py\b)")


def diagram() -> str:
    return DOC.read_text().split("```")[1]


def test_every_path_the_page_names_exists():
    named = set(PATH.findall(DOC.read_text()))
    assert len(named) > 30
    missing = sorted(path for path in named if not (ROOT / path).exists())
    assert not missing, f"docs/architecture.md names modules that do not exist: {missing}"


def test_every_module_in_the_diagram_exists_under_its_section():
    """The diagram names modules relative to the last full path above them (``routes/relay.py`` under
    ``lmi_tools/serving/``, ``hf.py`` under ``lmi_handlers/backends/``)."""
    base, missing = "", []
    for line in diagram().splitlines():
        for name in IN_DIAGRAM.findall(line):
            if name.startswith(("lmi_handlers/", "lmi_tools/")):
                base = name if name.endswith("/") else name.rsplit("/", 1)[0] + "/"
                candidates = [name]
            else:
                parts = base.rstrip("/").split("/")
                candidates = ["/".join(parts[:n]) + "/" + name for n in range(len(parts), 0, -1)]
            if not any((ROOT / c).exists() for c in candidates):
                missing.append((name, base))
    assert not missing, missing
