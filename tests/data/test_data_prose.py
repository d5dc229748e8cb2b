"""The prose corpus: formats, package layout, split by document, shards + manifest, text_dir, BPE on a tiny corpus.

No Debian package is needed: a fake package tree in the real formats is built in tmp_path.
"""

from __future__ import annotations

import gzip
import json

import pytest

from hybrid_attention.data import DataConfig, DataError, load_corpus, train_bpe_tokenizer
from hybrid_attention.data.corpus import is_validation
from hybrid_attention.data.formats import (
    chunk_entries,
    dictd_entries,
    html_to_text,
    pod_to_text,
    troff_to_text,
)
from hybrid_attention.data.prose import PACKAGE_VERSIONS, PROSE_SOURCES, iter_prose_documents, prose_corpus
from hybrid_attention.data.shards import text_dir_corpus, verify_manifest, write_shards

_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def _b64(n: int) -> str:
    s = ""
    while True:
        s = _B64[n % 64] + s
        n //= 64
        if n == 0:
            return s


def _write_dictd(base, entries: dict[str, str]) -> None:
    """A dictd database (``.index`` with base64-digit offsets, gzip'd ``.dict.dz``) like dict-gcide's."""
    blob, lines = b"", []
    for word, text in {"00-database-short": "header", **entries}.items():
        data = f"{word}\n{text}\n\n".encode()
        lines.append(f"{word}\t{_b64(len(blob))}\t{_b64(len(data))}")
        blob += data
    base.parent.mkdir(parents=True, exist_ok=True)
    (base.parent / (base.name + ".dict.dz")).write_bytes(gzip.compress(blob))
    (base.parent / (base.name + ".index")).write_text("\n".join(sorted(lines)) + "\n")


HTML = """<html><head><title>T</title><style>p {color: red}</style><script>var x = "<p>no</p>";</script></head>
<body><div class="sphinxsidebar">Navigation junk</div>
<div class="body" role="main"><h1>Caf&eacute; &amp; tea&para;</h1><p>First   paragraph
with <b>bold</b> text &lt;ok&gt; &#8212; done.</p><script>alert(1)</script><div><p>Nested.</p></div></div>
<div class="footer">Copyright junk</div></body></html>"""

TROFF = r""".\" a comment
.TH FOO 2 2023-01-01
.SH NAME
foo \- do a thing
.SH DESCRIPTION
.B foo ()
reads \fIfile\fP and returns \(em always \- zero.
.PP
.BR bar (7)
"""

POD = """=head1 NAME

perlfoo - a B<bold> and C<< $x->y >> test, see L<perlbar|perlbar/x> E<gt> all E<075>E<0x41>E<66>E<bogus>

=begin html

<p>dropped</p>

=end html

=cut
"""


def _fake_tree(root):
    """One folder per package, as ``build_prose_corpus.py fetch`` lays them out."""
    words = {f"Word{i}": f"Word{i} \\Word\\, n. A long definition number {i} " + "of prose " * 30 for i in range(60)}
    _write_dictd(root / "dict-gcide/usr/share/dictd/gcide", words)
    src = root / "python3.11-doc/usr/share/doc/python3.11/html/_sources/library"
    src.mkdir(parents=True)
    for i in range(30):
        (src / f"mod{i}.rst.txt").write_text(f"Module {i}\n========\n\n" + "Some documentation text. " * 20)
    return root


def test_dictd_entries_and_chunks(tmp_path):
    _write_dictd(tmp_path / "d/x", {"apple": "apple\n   a fruit", "bee": "bee\n   an insect"})
    entries = dictd_entries(tmp_path / "d/x.index", tmp_path / "d/x.dict.dz")
    assert [w for w, _ in entries] == ["apple", "bee"]  # the 00-database header is left out
    assert entries[0][1].startswith("apple\napple\n   a fruit")
    docs = chunk_entries([("w", "x" * 30)] * 10, chunk_chars=100)
    assert len(docs) == 3 and all(len(d) < 140 for d in docs)


def test_html_to_text_drops_tags_scripts_nav_and_decodes_entities():
    text = html_to_text(HTML)
    assert text.splitlines()[0] == "Café & tea"
    assert "First paragraph with bold text <ok> \u2014 done." in text and "Nested." in text
    for junk in ("alert", "color", "no</p>", "Navigation", "Copyright", "<", "\u00b6"):
        assert junk not in text.replace("<ok>", "")


def test_troff_and_pod():
    t = troff_to_text(TROFF)
    assert "comment" not in t and "FOO 2" not in t and "\\f" not in t
    assert "NAME\nfoo - do a thing" in t and "reads file and returns \u2014 always - zero." in t and "bar (7)" in t
    p = pod_to_text(POD)
    assert "perlfoo - a bold and $x->y test, see perlbar > all =AB" in p and "dropped" not in p and "=head" not in p


def test_prose_corpus_split_by_document_and_deterministic(tmp_path):
    root = _fake_tree(tmp_path / "pkgs")
    names = ["gcide", "python-docs"]
    docs = list(iter_prose_documents([root], names))
    keys = [d.key for d in docs]
    assert len(keys) == len(set(keys)) == 30 + 1  # 60 short entries -> one ~40 kB chunk; 30 pages
    assert keys[0] == "gcide/usr/share/dictd/gcide#00000"
    a = prose_corpus([root], 0.3, names=names)
    b = prose_corpus([root], 0.3, names=names)
    assert a.train == b.train and a.validation == b.validation and a.validation and a.train
    val = {d.text for d in docs if is_validation(d.key, 0.3)}
    assert set(a.validation) == val and not val & set(a.train)  # whole documents, by hash of their key
    cfg = DataConfig(source="prose", paths=[str(root)], prose_sources=names, val_fraction=0.3)
    assert load_corpus(cfg).validation == a.validation


def test_missing_package_names_it(tmp_path):
    root = _fake_tree(tmp_path / "pkgs")
    with pytest.raises(DataError, match=r"prose source perl-docs: .* install the Debian package perl-doc"):
        list(iter_prose_documents([root], ["gcide", "perl-docs"]))


def test_shards_round_trip_manifest_and_corruption(tmp_path):
    docs = [(f"src/doc{i}", "src", f"document {i} " + "é text " * (50 + i)) for i in range(40)]
    out = tmp_path / "shards"
    m = write_shards(docs, out, shard_raw_bytes=4000, preset=1)
    assert len(m["shards"]) > 1 and m["total_documents"] == 40
    assert verify_manifest(out)["total_documents"] == 40
    c = text_dir_corpus(out, 0.25)
    assert sorted(c.train + c.validation) == sorted(t for _, _, t in docs)
    assert set(c.validation) == {t for k, _, t in docs if is_validation(k, 0.25)}  # same split as the source
    cfg = DataConfig(source="text_dir", paths=[str(out)], val_fraction=0.25)
    assert load_corpus(cfg).train == c.train
    shard = out / m["shards"][1]["file"]
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 1
    shard.write_bytes(bytes(raw))
    with pytest.raises(DataError, match=f"shard .*{shard.name}: sha256 .* does not match the manifest") as e:
        text_dir_corpus(out)
    assert "\n" not in str(e.value)
    shard.unlink()
    with pytest.raises(DataError, match=f"shard .*{shard.name} is listed .* but missing"):
        text_dir_corpus(out)


def test_max_shard_bytes_splits(tmp_path):
    import random

    rng = random.Random(0)
    docs = [(f"d{i}", "s", "".join(rng.choice("abcdefghij") for _ in range(3000))) for i in range(8)]
    m = write_shards(docs, tmp_path, shard_raw_bytes=1 << 30, max_shard_bytes=6000, preset=1)
    assert len(m["shards"]) > 1 and all(s["bytes"] <= 6000 for s in m["shards"])


def test_text_dir_plain_and_gz_files(tmp_path):
    (tmp_path / "a.txt").write_text("alpha " * 20)
    (tmp_path / "b.txt.gz").write_bytes(gzip.compress(("beta " * 20).encode()))
    (tmp_path / "c.jsonl").write_text(json.dumps({"id": "x", "text": "gamma " * 20}) + "\n")
    (tmp_path / "tokenizer-bpe").mkdir()
    (tmp_path / "tokenizer-bpe" / "notes.txt").write_text("not a document")
    c = text_dir_corpus(tmp_path, 0.5)
    assert sorted(c.train + c.validation) == sorted(["alpha " * 20, "beta " * 20, "gamma " * 20])


def test_bpe_vocab_size_and_round_trip():
    texts = [f"The quick brown fox {i} jumps over the lazy dog; a dictionary of words." * 3 for i in range(200)]
    tok = train_bpe_tokenizer(texts, 400, min_frequency=1)
    assert len(tok) == 400
    s = "The lazy fox, 1913 Webster: caf\u00e9."
    assert tok.decode(tok(s, add_special_tokens=False)["input_ids"]) == s


def test_every_source_package_has_a_pinned_version():
    # fetch downloads PKG=VERSION for each source's package: a source without a pin would fetch whatever is newest
    packages = {s.package for s in PROSE_SOURCES}
    assert packages == set(PACKAGE_VERSIONS)
    assert all(v and " " not in v for v in PACKAGE_VERSIONS.values())
