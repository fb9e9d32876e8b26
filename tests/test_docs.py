"""The manual (docs/, mkdocs.yml) builds with no broken link or anchor, lists every page, and the README stays a
front page whose links into the manual land on a page and a heading that exist.

MkDocs counts warnings only when they are logged: `--quiet` hides them and a strict build then passes, so the
builds here (as `make test`'s) run without it, and one test shows that a broken anchor does fail the build.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
README_MAX_LINES = 250


def build(root: Path, site: Path) -> subprocess.CompletedProcess:
    """`mkdocs build --strict` of the project at ROOT (its mkdocs.yml and docs/) into SITE."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                           str(root / "mkdocs.yml"), "--site-dir", str(site)],
                          cwd=root, env=env, capture_output=True, text=True, timeout=300)


def manual_copy(root: Path) -> Path:
    root.mkdir()
    shutil.copy(REPO / "mkdocs.yml", root / "mkdocs.yml")
    shutil.copytree(DOCS, root / "docs")
    return root


def nav_pages(nav) -> list[str]:
    """Every page the nav of mkdocs.yml names (sections flattened)."""
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, dict):
        return [p for value in nav.values() for p in nav_pages(value)]
    return [p for item in nav for p in nav_pages(item)]


def headings(markdown: str) -> set[str]:
    """The anchors MkDocs gives a page's headings (Python-Markdown's toc slugify), code blocks left out."""
    from markdown.extensions.toc import slugify

    text = re.sub(r"^```.*?^```", "", markdown, flags=re.S | re.M)
    return {slugify(m.group(1).strip(), "-") for m in re.finditer(r"^#{1,6} (.+)$", text, flags=re.M)}


def test_the_manual_builds_strict(tmp_path):
    done = build(REPO, tmp_path / "site")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (tmp_path / "site" / "index.html").is_file()


@pytest.mark.parametrize("link, named", [
    ("dvc.md#no-such-anchor", "#no-such-anchor"),
    ("no-such-page.md", "no-such-page.md"),
])
def test_a_broken_link_or_anchor_fails_the_build(tmp_path, link, named):
    root = manual_copy(tmp_path / "project")
    page = root / "docs" / "datasets.md"
    page.write_text(page.read_text() + f"\nSee [there]({link}).\n")
    done = build(root, tmp_path / "site")
    assert done.returncode != 0, "a broken link passed the strict build"
    assert named in done.stdout + done.stderr and "datasets.md" in done.stdout + done.stderr


def test_a_page_left_out_of_the_nav_fails_the_build(tmp_path):
    root = manual_copy(tmp_path / "project")
    (root / "docs" / "orphan.md").write_text("# Orphan\n\nNo page links here and the nav leaves it out.\n")
    done = build(root, tmp_path / "site")
    assert done.returncode != 0 and "orphan.md" in done.stdout + done.stderr


def test_every_page_is_in_the_nav_and_every_nav_entry_is_a_page():
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    listed = nav_pages(config["nav"])
    assert len(listed) == len(set(listed)), "a page is listed twice"
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.glob("*.md")}
    assert pages - set(listed) == set(), "pages missing from mkdocs.yml's nav"
    assert all((DOCS / p).is_file() for p in listed), [p for p in listed if not (DOCS / p).is_file()]


def test_the_readme_is_a_front_page_whose_links_land():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= README_MAX_LINES, f"README.md has {len(readme.splitlines())} lines"
    links = re.findall(r"\]\(((?:docs/)[^)\s]*|#[^)\s]*)\)", readme)
    assert any(link.startswith("docs/") for link in links)
    for link in links:
        path, _, anchor = link.partition("#")
        target = REPO / path if path else REPO / "README.md"
        assert target.is_file(), link
        if anchor and target.suffix == ".md":
            assert anchor in headings(target.read_text()), f"README.md links to {link}: no such heading"
