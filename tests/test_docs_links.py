"""Every relative link of the docs, the README and the changelog leads somewhere: the file exists and its #anchor is
a heading of the target (GitHub's slugs) or an explicit ``<a id>``; and every ``docs/PAGE.md#anchor`` that rlft's
code, tests and scripts name does too (messages and help texts send users there)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support import ROOT

HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")
ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")
LINK = re.compile(r"\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def _prose(text: str) -> list[str]:
    """The lines outside code blocks (fenced or indented), inline code removed."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        out.append("" if fenced or line.startswith("    ") else re.sub(r"`[^`]*`", "", line))
    return out


def slug(title: str) -> str:
    t = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", title)
    t = re.sub(r"<[^>]+>", "", t).replace("`", "").strip().lower()
    return re.sub(r"[^\w\- ]", "", t).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    text = page.read_text()
    out |= set(ANCHOR.findall(text))
    for line in _prose(text.replace("`", "\x00")):  # headings keep their code spans
        m = HEADING.match(line.replace("\x00", "`"))
        if m:
            s = slug(m[1])
            out.add(f"{s}-{seen[s]}" if s in seen else s)
            seen[s] = seen.get(s, 0) + 1
    return out


def _broken(source: Path, target: str) -> str | None:
    path, _, anchor = target.partition("#")
    dest = (source.parent / path).resolve() if path else source.resolve()
    if not dest.exists():
        return "no such file"
    if anchor and (dest.suffix != ".md" or anchor not in anchors(dest)):
        return f"no heading #{anchor}"
    return None


def test_every_relative_link_of_the_docs_resolves():
    pages = [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md", ROOT / "CHANGELOG.md"]
    broken, count = [], 0
    for page in pages:
        for n, line in enumerate(_prose(page.read_text()), 1):
            for target in LINK.findall(line):
                if re.match(r"^[a-zA-Z][\w+.-]*:", target):
                    continue  # https:, mailto:
                count += 1
                why = _broken(page, target)
                if why:
                    broken.append(f"{page.relative_to(ROOT)}:{n}: {target}: {why}")
    assert count > 100 and broken == []


def test_every_docs_page_the_code_names_exists_with_its_anchor():
    named = re.compile(r"docs/[\w/-]+\.md(?:#[\w-]+)?")
    broken = []
    for f in [*ROOT.joinpath("rlft").rglob("*.py"), *ROOT.joinpath("scripts").rglob("*.py"), *ROOT.joinpath("conf").rglob("*.yaml")]:
        for ref in set(named.findall(f.read_text())):
            why = _broken(ROOT / "x", ref)
            if why:
                broken.append(f"{f.relative_to(ROOT)}: {ref}: {why}")
    assert broken == []
