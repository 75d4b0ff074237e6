"""The documentation a newcomer reads first: README.md fits on a screen or two, and every relative link in it and in
docs/ points at a file (and heading) of the repository, never at a path outside it."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE_BLOCK = re.compile(r"```.*?```", re.S)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but `-` and `_` dropped, spaces as `-`."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = CODE_BLOCK.sub("", path.read_text(encoding="utf-8"))
    return {slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", text, re.M)}


def relative_links(path: Path) -> list[str]:
    text = CODE_BLOCK.sub("", path.read_text(encoding="utf-8"))
    return [t for t in LINK.findall(text) if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


def test_readme_is_at_most_150_lines():
    assert len((REPO / "README.md").read_text(encoding="utf-8").splitlines()) <= 150


def test_every_relative_link_in_readme_and_docs_points_at_a_file_and_heading_of_the_repository():
    broken = []
    for doc in DOCS:
        for target in relative_links(doc):
            file_part, _, anchor = target.partition("#")
            path = (doc.parent / file_part).resolve() if file_part else doc
            if not path.is_relative_to(REPO) or not path.exists():
                broken.append(f"{doc.relative_to(REPO)}: {target} (no such file)")
            elif anchor and path.suffix == ".md" and anchor not in anchors(path):
                broken.append(f"{doc.relative_to(REPO)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_docs_name_no_path_outside_the_repository():
    outside = [
        f"{doc.relative_to(REPO)}:{n}"
        for doc in DOCS
        for n, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1)
        if "/work/" in line or "../shared" in line
    ]
    assert not outside, outside
