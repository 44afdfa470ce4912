"""The README is a front page, and every relative link in the Markdown the
project ships (README.md, docs/, benchmarks/, examples/) leads somewhere:
the file or directory exists and, for `page.md#anchor`, the page has a
heading with that anchor (GitHub's rule: lower case, punctuation dropped,
spaces to hyphens, repeats numbered)."""

import pathlib
import re
import subprocess

ROOT = pathlib.Path(__file__).resolve().parent.parent

#: `[text](target)` and `![alt](target)`, with an optional "title"
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"`[^`]*`")
HEADING = re.compile(r"#{1,6}\s+(.*?)\s*#*\s*$")


def markdown_files():
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard",
                             "*.md"], cwd=ROOT, capture_output=True, text=True, check=True)
    return sorted(ROOT / name for name in listed.stdout.split() if (ROOT / name).exists())


def prose_lines(text):
    """(number, line) of the lines outside fenced code blocks."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            yield number, line


def links(line):
    return LINK.findall(CODE_SPAN.sub("", line))


def anchors(text):
    """The anchors GitHub gives the headings of a Markdown text."""
    seen = {}
    for _, line in prose_lines(text):
        heading = HEADING.match(line)
        if heading:
            slug = re.sub(r"[^\w\- ]", "", heading.group(1).lower()).replace(" ", "-")
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            yield slug if count == 0 else f"{slug}-{count}"


def broken_links(path):
    text = path.read_text(encoding="utf-8")
    for number, line in prose_lines(text):
        for target in links(line):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):
                continue  # https:, mailto:: not ours to check here
            file_part, _, anchor = target.partition("#")
            where = (path.parent / file_part).resolve() if file_part else path
            place = f"{path.relative_to(ROOT)}:{number}: {target}"
            if not where.exists():
                yield f"{place} (no such file)"
            elif anchor and where.suffix == ".md" and anchor not in set(
                    anchors(where.read_text(encoding="utf-8"))):
                yield f"{place} (no heading with that anchor)"


def test_every_relative_link_in_the_markdown_resolves():
    files = markdown_files()
    assert ROOT / "README.md" in files and any(p.parent.name == "docs" for p in files)
    broken = [problem for path in files for problem in broken_links(path)]
    assert not broken, "broken links (fix the target or the link):\n" + "\n".join(broken)


def test_readme_is_a_front_page_that_links_every_docs_page():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 250, (
        "README.md is a front page of at most 250 lines: move details to a docs/ page")
    linked = {(ROOT / target.partition("#")[0]).resolve()
              for _, line in prose_lines(readme) for target in links(line)}
    pages = sorted((ROOT / "docs").glob("*.md"))
    assert pages, "docs/ has no pages"
    unlinked = [page.name for page in pages if page not in linked]
    assert not unlinked, f"docs pages the README does not link: {unlinked}"


def test_readme_says_on_its_first_screen_what_forkserve_needs():
    first_screen = " ".join((ROOT / "README.md").read_text(encoding="utf-8").splitlines()[:60])
    for needed in ("Linux only", "/proc", "CPython 3.12"):
        assert needed in first_screen, f"README.md's first 60 lines must say {needed!r}"


def test_anchors_follow_githubs_rule():
    text = "# Why\n## Seeing it: the memory reporter\n### `forkserve.share(data)` (3.12+)\n## Why\n"
    assert list(anchors(text)) == [
        "why", "seeing-it-the-memory-reporter", "forkservesharedata-312", "why-1"]


#: a date or a clock time: a run log's, which belongs beside its result
TIME_STAMP = re.compile(r"\b20\d\d-\d\d-\d\d\b|\b\d\d:\d\d(?:-\d\d:\d\d)? UTC\b")


def test_guides_carry_no_run_logs():
    """docs/ answers a user's questions; when and under what load a figure was
    measured lives beside its result in benchmarks/results/ (docs/benchmarks.md,
    the benchmarks' own page, excepted)."""
    guides = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
              *sorted((ROOT / "examples").glob("**/README.md"))]
    found = [f"{path.relative_to(ROOT)}:{number}: {stamp.group()}"
             for path in guides if path.name != "benchmarks.md" or path.parent.name != "docs"
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             for stamp in TIME_STAMP.finditer(line)]
    assert not found, ("time stamps in the guides: move the run log to a notes.md beside the "
                       "result and link it:\n" + "\n".join(found))
    memory = (ROOT / "docs" / "memory.md").read_text(encoding="utf-8")
    assert len(memory.splitlines()) <= 400, "docs/memory.md is a guide of at most 400 lines"
