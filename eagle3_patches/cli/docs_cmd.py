"""``eagle3-patches docs [PAGE]``: the documentation shipped with the package.

Without PAGE: the pages, one a line with its title.  With PAGE (``doctor``, ``doctor.md`` or
``docs/doctor.md``): the page's markdown on stdout (through a pager on a terminal).  Exit
status: 0 printed, 1 the docs are missing from this install, 2 unknown page (the list on stderr).
"""

from __future__ import annotations

import argparse
import pydoc
import sys
from pathlib import Path

from .._shipped import DOCS_PACKAGE, shipped_dir
from ..errors import Eagle3Error


def add_parser(sub) -> None:
    p = sub.add_parser(
        "docs",
        help="list the documentation pages, or print one (the docs/*.md pages of the repository)",
        description="The documentation pages shipped with eagle3-patches (docs/*.md in the repository): the "
        "operator's pages first, then the contributor's.",
        epilog="examples:\n  eagle3-patches docs              # the pages\n  eagle3-patches docs troubleshooting\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("page", nargs="?", metavar="PAGE", help="a page name, e.g. doctor (default: list the pages)")
    p.set_defaults(func=run)


#: the operator's pages, in reading order; every other page is the contributor's (how the project is built and
#: tested), listed after them
USER_PAGES = (
    "troubleshooting",
    "doctor",
    "upgrading",
    "tune",
    "checkpoints",
    "patches",
    "compat",
    "targets",
    "distributed",
    "fork",
    "security",
)


def pages() -> dict[str, Path]:
    """Page name -> its file, from the shipped docs (empty when this install has none): the operator's pages first
    (:data:`USER_PAGES`), then the others by name."""
    directory = shipped_dir(DOCS_PACKAGE)
    if directory is None:
        return {}
    found = {f.stem: f for f in sorted(directory.glob("*.md"))}
    order = [n for n in USER_PAGES if n in found] + [n for n in found if n not in USER_PAGES]
    return {n: found[n] for n in order}


def _title(path: Path) -> str:
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("# "):
            return line[2:].strip()
    return ""


def listing(found: dict[str, Path]) -> str:
    width = max(map(len, found))
    groups = (
        ("for operators:", [n for n in found if n in USER_PAGES]),
        ("for contributors:", [n for n in found if n not in USER_PAGES]),
    )
    return "\n".join(
        line
        for title, names in groups
        if names
        for line in (title, *(f"  {n:<{width}}  {_title(found[n])}" for n in names))
    )


def run(args) -> int:
    found = pages()
    if not found:
        raise Eagle3Error(
            f"eagle3-patches: no documentation pages in this install (the package data {DOCS_PACKAGE}); reinstall "
            "eagle3-patches"
        )
    if args.page is None:
        print("eagle3-patches docs PAGE prints a page:\n" + listing(found))
        return 0
    name = Path(args.page).name.removesuffix(".md")
    if name not in found:
        print(f"eagle3-patches docs: no page {args.page!r}; the pages:\n" + listing(found), file=sys.stderr)
        return 2
    pydoc.pager(found[name].read_text(encoding="utf-8"))
    return 0
