"""The text policy of CONTRIBUTING.md: code, configs, scripts, tests and documents speak of the project alone.

No history (numbered sessions or device calls, "until session ...", "earlier layout", "before the change"), no names
of individual runs or lanes, no limits or paths of particular machines, no pointers outside the repository. Data files
under ``results/`` (json, jsonl, csv, logs) are records and are not checked; Markdown there is.
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CODE_DIRS = ("hybrid_attention", "benchmarks", "configs", "scripts", "tests", "tools")
CODE_SUFFIXES = {".py", ".yaml", ".yml", ".sh", ".toml", ".cfg", ".txt", ".md"}
MARKDOWN_DIRS = ("docs", "results")
SELF = Path(__file__).resolve()

# Each pattern names one forbidden thing; word boundaries keep ordinary words ("call", "session" alone, "carry" of a
# scan, ``current_device``) legal.
PATTERNS: dict[str, re.Pattern[str]] = {
    "numbered session": re.compile(r"\bsessions?[ _-]?\d+(?:\s*(?:[-–—]|to|and)\s*\d+)?\b", re.IGNORECASE),
    "numbered device call": re.compile(r"\b(?:device )?calls?[ _-]?\d+\b(?!\s*(?:times|x)\b)", re.IGNORECASE),
    "device call": re.compile(r"\bdevice calls?\b", re.IGNORECASE),
    "issue number": re.compile(r"\bissues?[ -]\d+\b|\bissues? #\d+", re.IGNORECASE),
    "numbered lane": re.compile(r"\blanes?[ _-]?\d+\b", re.IGNORECASE),
    "run log name": re.compile(r"console_session", re.IGNORECASE),
    "until a later run": re.compile(
        r"\buntil (?:the next |a later |a |the )?(?:session|call|lane|run on|device run|A/B)\b", re.IGNORECASE),
    "earlier layout": re.compile(r"\bearlier layouts?\b", re.IGNORECASE),
    "before the change": re.compile(r"\bbefore the change\b", re.IGNORECASE),
    "path outside the repository": re.compile(r"\.\./shared\b|(?<![\w.])/work/|/tmp/briefs\b"),
    "transfer limit": re.compile(r"\bMiB parts?\b|\bfiles_at\b|\bfiles_fetch\b", re.IGNORECASE),
    "device carry list": re.compile(r"\bcarry(?:=|:)\s*\[|\bthe carry list\b|\bcarry (?:paths?|the venv)\b",
                                    re.IGNORECASE),
}


QUOTES = "\"'`“”"


def _quoted(line: str, match: re.Match[str]) -> bool:
    """A phrase quoted whole as an example of what is forbidden (``"earlier layout"``), as the policy itself does."""
    start, end = match.span()
    return start > 0 and end < len(line) and line[start - 1] in QUOTES and line[end] in QUOTES


def _checked_files() -> list[Path]:
    files: list[Path] = []
    for name in CODE_DIRS:
        base = ROOT / name
        if base.is_dir():
            files += [p for p in base.rglob("*") if p.is_file() and p.suffix in CODE_SUFFIXES]
    for name in MARKDOWN_DIRS:
        base = ROOT / name
        if base.is_dir():
            files += list(base.rglob("*.md"))
    files += list(ROOT.glob("*.md"))
    return sorted({p.resolve() for p in files if "__pycache__" not in p.parts and p.resolve() != SELF})


def _offences() -> list[str]:
    found = []
    for path in _checked_files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for lineno, line in enumerate(text.splitlines(), 1):
            for what, pattern in PATTERNS.items():
                match = pattern.search(line)
                if match and not _quoted(line, match):
                    found.append(f"{path.relative_to(ROOT)}:{lineno}: {what}: {match.group(0)!r}")
    return found


@pytest.mark.parametrize(("text", "what"), [
    ("as measured in session 12", "numbered session"),
    ("sessions 3–5 showed", "numbered session"),
    ("device call 4 timed out", "numbered device call"),
    ("lane 2 ran the cube", "numbered lane"),
    ("so that a device call ends in time", "device call"),
    ("packed documents (issue 17)", "issue number"),
    ("the issue-13 mixers", "issue number"),
    ("kept until session 40", "numbered session"),
    ("kept until the next session", "until a later run"),
    ("rows of the earlier layout", "earlier layout"),
    ("slower before the change", "before the change"),
    ("see ../shared/DESIGN.md", "path outside the repository"),
    ("copied to /work/main/results", "path outside the repository"),
    ("split into 15 MiB parts", "transfer limit"),
])
def test_patterns_catch_forbidden_text(text: str, what: str) -> None:
    assert PATTERNS[what].search(text), (what, text)


@pytest.mark.parametrize("text", [
    "torch.cuda.current_device()",
    "the state-carry gradient",
    "call the op once per chunk",
    "one session of the tokenizer",
    "wait until the new copy is in place",
    "from hybrid_attention.ops import call_op",
    "return work / total",
])
def test_patterns_leave_ordinary_text(text: str) -> None:
    assert not [what for what, p in PATTERNS.items() if p.search(text)], text


def test_a_quoted_example_is_not_an_offence() -> None:
    line = 'No history ("session N", "until X", "earlier layout"), as in session 4'
    quoted = PATTERNS["earlier layout"].search(line)
    assert quoted is not None and _quoted(line, quoted)
    bare = PATTERNS["numbered session"].search(line)
    assert bare is not None and not _quoted(line, bare)


def test_no_forbidden_text() -> None:
    offences = _offences()
    assert not offences, f"{len(offences)} lines break the text policy (CONTRIBUTING.md):\n" + "\n".join(offences)
