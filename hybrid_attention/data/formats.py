"""Readers that turn documentation in its shipped format into plain text: dictd databases, plain text, HTML, troff
man pages and POD (``prose.parse_file`` picks one per source)."""

from __future__ import annotations

import gzip
import re
from html.parser import HTMLParser
from pathlib import Path

from hybrid_attention.errors import DataError

_B64 = {c: i for i, c in enumerate("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")}


def read_bytes(path: Path) -> bytes:
    """File contents, gunzipped for ``.gz``/``.dz`` (dictzip is gzip-compatible)."""
    try:
        data = path.read_bytes()
        return gzip.decompress(data) if path.suffix in (".gz", ".dz") else data
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise DataError(f"cannot read {path}: {type(e).__name__}: {e}") from e


def read_text(path: Path) -> str:
    """UTF-8 text of a file (gunzipped if needed); undecodable bytes are replaced."""
    return read_bytes(path).decode("utf-8", errors="replace")


def _b64_number(s: str) -> int:
    n = 0
    for c in s:
        n = n * 64 + _B64[c]
    return n


def dictd_entries(index: Path, data: Path) -> list[tuple[str, str]]:
    """``(headword, text)`` of every entry of a dictd database, in data-file order, without ``00-database-*``."""
    raw = read_bytes(data)
    seen: set[tuple[int, int]] = set()
    spans = []
    for line in read_text(index).splitlines():
        parts = line.split("\t")
        if len(parts) < 3 or parts[0].startswith("00-database") or parts[0].startswith("00database"):
            continue
        try:
            span = (_b64_number(parts[1]), _b64_number(parts[2]))
        except KeyError as e:
            raise DataError(f"{index}: malformed dictd index line {line[:60]!r}") from e
        if span not in seen:  # one entry may be indexed under several headwords
            seen.add(span)
            spans.append((span[0], span[1], parts[0]))
    spans.sort()
    return [(word, raw[off : off + n].decode("utf-8", errors="replace").strip()) for off, n, word in spans]


def chunk_entries(entries: list[tuple[str, str]], chunk_chars: int = 40_000) -> list[str]:
    """Consecutive entries joined by blank lines into documents of about ``chunk_chars`` characters."""
    docs, cur, size = [], [], 0
    for _, text in entries:
        if not text:
            continue
        cur.append(text)
        size += len(text) + 2
        if size >= chunk_chars:
            docs.append("\n\n".join(cur))
            cur, size = [], 0
    if cur:
        docs.append("\n\n".join(cur))
    return docs


def normalize_whitespace(text: str) -> str:
    """Strip trailing spaces, collapse runs of blank lines to one, trim."""
    lines = [ln.rstrip() for ln in text.splitlines()]
    out: list[str] = []
    for ln in lines:
        if ln or (out and out[-1]):
            out.append(ln)
    return "\n".join(out).strip()


# --- HTML ---------------------------------------------------------------------------------------------------------

_BLOCK = {"p", "div", "br", "li", "ul", "ol", "dl", "dt", "dd", "tr", "table", "pre", "section", "article",
          "blockquote", "h1", "h2", "h3", "h4", "h5", "h6", "hr", "title", "figcaption", "caption"}
_DROP = {"script", "style", "head", "nav", "header", "footer", "noscript", "svg", "button", "form", "select"}
_VOID = {"br", "hr", "img", "meta", "link", "input", "area", "base", "col", "embed", "source", "track", "wbr"}
_NAV_WORDS = ("nav", "sphinxsidebar", "footer", "header", "related", "dropdown", "treeview", "breadcrumb", "search",
              "toc", "menu", "skip")


def _is_main(tag: str, attrs: dict) -> bool:
    cls = (attrs.get("class") or "").split()
    return attrs.get("role") == "main" or (tag == "div" and "body" in cls) or attrs.get("id") == "docs-content"


def _is_nav(attrs: dict) -> bool:
    words = ((attrs.get("class") or "") + " " + (attrs.get("id") or "")).lower()
    return any(w in words for w in _NAV_WORDS)


class _TextExtractor(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []  # all body text
        self.main: list[str] = []  # text inside the main block
        self._skip: list[tuple[str, int]] = []  # (tag, nesting depth) of the dropped element being skipped
        self._main: list | None = None  # [tag, nesting depth] while inside the main block
        self._main_done = False
        self._pre = 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if self._skip:
            t, d = self._skip[-1]
            if tag == t and tag not in _VOID:
                self._skip[-1] = (t, d + 1)
            return
        if tag in _DROP or (tag not in _VOID and _is_nav(a)):
            if tag not in _VOID:
                self._skip.append((tag, 1))
            return
        if self._main is not None and tag == self._main[0] and tag not in _VOID:
            self._main[1] += 1
        elif self._main is None and not self._main_done and tag not in _VOID and _is_main(tag, a):
            self._main = [tag, 1]
        if tag == "pre":
            self._pre += 1
        if tag in _BLOCK:
            self._emit("\n")

    def handle_endtag(self, tag):
        if self._skip:
            t, d = self._skip[-1]
            if tag == t:
                self._skip[-1] = (t, d - 1)
                if d == 1:
                    self._skip.pop()
            return
        if tag == "pre" and self._pre:
            self._pre -= 1
        if tag in _BLOCK:
            self._emit("\n")
        if self._main is not None and tag == self._main[0]:
            self._main[1] -= 1
            if self._main[1] == 0:
                self._main, self._main_done = None, True

    def handle_data(self, data):
        if self._skip:
            return
        if not self._pre:
            data = re.sub(r"[ \t\r\n\f\v]+", " ", data)
        self._emit(data)

    def _emit(self, s: str) -> None:
        self.parts.append(s)
        if self._main is not None:
            self.main.append(s)


def html_to_text(html: str) -> str:
    """Visible text of an HTML page (its main block when it has one), whitespace normalised."""
    p = _TextExtractor()
    p.feed(html)
    p.close()
    text = "".join(p.main if p._main_done or p.main else p.parts)
    text = text.replace("\u00b6", "")  # Sphinx permalink pilcrows
    return normalize_whitespace("\n".join(ln.strip() for ln in text.splitlines()))


# --- troff (man pages) -------------------------------------------------------------------------------------------

_TROFF_NAMED = {"em": "\u2014", "en": "\u2013", "aq": "'", "dq": '"', "lq": "\u201c", "rq": "\u201d", "oq": "\u2018",
                "cq": "\u2019", "bu": "\u2022", "co": "\u00a9", "rg": "\u00ae", "hy": "-", "mi": "-", "pl": "+",
                "mu": "\u00d7", "<=": "\u2264", ">=": "\u2265", "!=": "\u2260", "->": "\u2192", "<-": "\u2190",
                "ti": "~", "ha": "^", "rs": "\\", "sl": "/", "ba": "|", "at": "@", "sh": "#", "Do": "$", "de": "\u00b0"}
_TEXT_MACROS = {"SH", "SS", "B", "I", "BR", "BI", "IB", "IR", "RB", "RI", "SM", "SB", "TP", "IP", "HP", "Nm", "Nd",
                "Sh", "Ss", "Fn", "Fa", "Ar", "Fl", "Cm", "Pa", "Xr", "Dv", "Er", "Ev", "Va", "Vt", "Ft", "Fd", "Li",
                "Em", "Sy", "Ql", "Dq", "Sq", "Pq", "Op", "It", "MT", "UR"}
_ESCAPES = [
    (re.compile(r"\\f(\[[^\]]*\]|\(..|.)"), ""),  # font changes
    (re.compile(r"\\s[+-]?(\d|\(\d\d|\[\d+\])"), ""),  # size changes
    (re.compile(r"\\[*]?\((..)"), lambda m: _TROFF_NAMED.get(m.group(1), "")),
    (re.compile(r"\\[*]?\[([^\]]*)\]"), lambda m: _TROFF_NAMED.get(m.group(1), "")),
    (re.compile(r"\\\*(.)"), ""),
    (re.compile(r"\\[hvwlLxoNSDZbn]'[^']*'"), ""),
    (re.compile(r"\\[nk](\(..|\[[^\]]*\]|.)"), ""),
    (re.compile(r"\\[-]"), "-"),
    (re.compile(r"\\[e\\]"), "\\\\"),
    (re.compile(r"\\[ ~0]"), " "),
    (re.compile(r"\\[&|^%c:)/,!]"), ""),
    (re.compile(r"\\(.)"), r"\1"),
]


def _troff_inline(s: str) -> str:
    for pat, rep in _ESCAPES:
        s = pat.sub(rep, s)
    return s


def _macro_args(rest: str) -> str:
    args = re.findall(r'"([^"]*)"|(\S+)', rest)
    return " ".join(a or b for a, b in args)


def troff_to_text(src: str) -> str:
    """Readable text of a man page's troff source (man and mdoc macros, minimal)."""
    out: list[str] = []
    for line in src.splitlines():
        if line.startswith(('.\\"', "'\\\"", '\\"')) or line.startswith(".so "):
            continue
        if line.startswith((".", "'")):
            m = re.match(r"[.']\s*(\S+)\s*(.*)", line)
            if not m:
                continue
            macro, rest = m.groups()
            if macro in _TEXT_MACROS and rest:
                text = _troff_inline(_macro_args(rest))
                out.append(("\n" + text.upper()) if macro in ("SH", "Sh") else text)
            elif macro in ("PP", "LP", "P", "sp", "Pp", "IP", "TP", "br"):
                out.append("")
            continue
        out.append(_troff_inline(line))
    return normalize_whitespace("\n".join(out))


# --- POD ---------------------------------------------------------------------------------------------------------

_POD_ENTITIES = {"lt": "<", "gt": ">", "verbar": "|", "sol": "/", "quot": '"', "amp": "&", "apos": "'"}
_POD_CODE = re.compile(r"([A-Z])<<+\s(.*?)\s>>+|([A-Z])<([^<>]*)>", re.S)


def _pod_number(body: str) -> str:
    """``E<0x201E>`` (hex), ``E<075>`` (octal), ``E<181>`` (decimal); anything else is dropped."""
    try:
        n = int(body, 16) if body.lower().startswith("0x") else int(body, 8) if body.startswith("0") else int(body)
        return chr(n)
    except (ValueError, OverflowError):
        return ""


def _pod_code(m: re.Match) -> str:
    code, body = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
    if code == "E":
        return _POD_ENTITIES.get(body) or _pod_number(body)
    if code == "L":
        return body.split("|", 1)[0] if "|" in body else body.split("/")[-1].strip('"')
    if code in ("Z", "X"):
        return ""
    return body


def pod_to_text(src: str) -> str:
    """Plain text of a POD document (``=head``/``=item`` texts kept, ``=begin``...``=end`` blocks dropped)."""
    out: list[str] = []
    skipping = False
    for para in re.split(r"\n\s*\n", src):
        if para.startswith("="):
            cmd, _, rest = para[1:].partition(" ")
            cmd = cmd.strip()
            if cmd == "begin":
                skipping = True
            elif cmd == "end":
                skipping = False
            elif cmd.startswith("head") or cmd == "item":
                out.append(rest.strip())
            continue
        if skipping:
            continue
        out.append(para)
    text = "\n\n".join(out)
    for _ in range(4):  # nested codes resolve from the inside out
        new = _POD_CODE.sub(_pod_code, text)
        if new == text:
            break
        text = new
    return normalize_whitespace(text)
