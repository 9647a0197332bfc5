"""Every cross-reference in the docs resolves (issue 43: two in ``docs/protocol.md`` pointed
nowhere, and nothing checked them).

The docs refer to a section by its heading in quotes after the file
(``docs/sglang.md``, "Sleep"; a heading may go on past the quote: "Changing it without
editing JSON" names ``Changing it without editing JSON: `ktctl config` ...``), to one of
their own as ``see "Compatibility"``, and by Markdown links (``[text](file.md#anchor)``,
GitHub's anchors). Each must name a file that exists and a heading it has.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = sorted(
    {
        *REPO.glob("docs/*.md"),
        REPO / "README.md",
        REPO / "tests" / "README.md",
        *REPO.glob("clients/*/README.md"),
    }
)

SECTION_REF = re.compile(r'`?((?:[\w.-]+/)*[\w.-]+\.md)`?,? "([^"]+)"')
SELF_REF = re.compile(r'\b[Ss]ee "([^"]+)"')
LINK = re.compile(r"\]\(([^)\s]+)\)")


def headings(path: Path) -> list[str]:
    out, fenced = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            out.append(line.lstrip("#").strip())
    return out


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation gone, spaces to dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def names_a_heading(section: str, path: Path) -> bool:
    return any(h == section or h.startswith(section) for h in headings(path))


def flat(path: Path) -> str:
    """The text with its lines joined: a reference may be wrapped."""
    return re.sub(r"\s*\n\s*", " ", path.read_text(encoding="utf-8"))


def where(ref: str, doc: Path) -> Path | None:
    for base in (REPO, doc.parent, REPO / "docs"):
        if (base / ref).exists():
            return base / ref
    return None


def broken(doc: Path) -> list[str]:
    out = []
    text = flat(doc)
    for m in SECTION_REF.finditer(text):
        target = where(m.group(1), doc)
        if target is None:
            out.append(f"{m.group(0)}: no such file")
        elif not names_a_heading(m.group(2), target):
            out.append(f"{m.group(0)}: {target.name} has no such heading")
    for m in SELF_REF.finditer(text):
        if not names_a_heading(m.group(1), doc):
            out.append(f"{m.group(0)}: no such heading here")
    for m in LINK.finditer(doc.read_text(encoding="utf-8")):
        link = m.group(1)
        if link.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, frag = link.partition("#")
        target = doc if not path else doc.parent / path
        if not target.exists():
            out.append(f"{link}: no such file")
        elif frag and frag not in {anchor(h) for h in headings(target)}:
            out.append(f"{link}: no such anchor")
    return out


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: str(d.relative_to(REPO)))
def test_every_cross_reference_resolves(doc: Path) -> None:
    assert broken(doc) == []


def test_the_checker_finds_what_points_nowhere(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        '# Title\n\n## Versions\n\nsee "Versions"; see "Nowhere"; (`page.md`, "Versions")\n'
        '(`page.md`, "Versions and more") [x](#versions) [y](#nope) [z](other.md)\n',
        encoding="utf-8",
    )
    assert len(broken(page)) == 4
