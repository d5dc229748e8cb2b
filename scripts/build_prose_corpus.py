#!/usr/bin/env python
"""Build the offline prose corpus: Debian packages -> xz JSONL shards + manifest (+ a BPE tokenizer).

  # 1. fetch the packages (apt-get download + dpkg-deb -x, one folder per package; nothing is installed)
  python scripts/build_prose_corpus.py fetch --root PACKAGES_DIR
  # 2. parse them into shards (each <= 60 MiB compressed) with manifest.json; prints the source table
  python scripts/build_prose_corpus.py shards --root PACKAGES_DIR --out build/prose
  # 3. train the BPE tokenizer on the train split of the shards, save it (configs/tokenizers/prose-bpe8192), count
  #    the corpus' tokens
  python scripts/build_prose_corpus.py tokenizer --out build/prose --vocab 8192 [--measure-token-shards]

``all`` does the three steps. The GPU side needs only the shard folder (shards + manifest.json) and the committed
tokenizer: ``data: {source: text_dir, paths: [build/prose], tokenizer: configs/tokenizers/prose-bpe8192}``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hybrid_attention.data.corpus import is_validation  # noqa: E402
from hybrid_attention.data.prose import PACKAGE_VERSIONS, get_sources, iter_prose_documents  # noqa: E402
from hybrid_attention.data.shards import MIB, text_dir_corpus, write_shards  # noqa: E402
from hybrid_attention.data.tokenizer import encode_documents, train_bpe_tokenizer  # noqa: E402

TRANSFER = 64 * MIB


def fetch(root: Path, names: list[str]) -> dict:
    """apt-get download each source's package into ROOT/debs and extract it into ROOT/PACKAGE."""
    debs = root / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    packages = sorted({s.package for s in get_sources(names)})
    # pinned versions (PACKAGE_VERSIONS): the same text as the stored runs', whatever the mirror's newest is
    pinned = [f"{p}={PACKAGE_VERSIONS[p]}" for p in packages]
    missing = [p for p in pinned if not subprocess.run(["apt-cache", "show", p], capture_output=True).stdout]
    if missing:
        raise SystemExit(f"error: {', '.join(missing)} not in this machine's apt lists; run `apt-get update` "
                         "(several pinned versions are in bookworm-security) and fetch again")
    subprocess.run(["apt-get", "download", *pinned], cwd=debs, check=True)
    versions = {}
    for pkg in packages:
        (deb,) = sorted(debs.glob(f"{pkg}_*.deb"))[-1:]
        versions[pkg] = subprocess.run(["dpkg-deb", "-f", str(deb), "Version"], check=True, capture_output=True,
                                       text=True).stdout.strip()
        if versions[pkg] != PACKAGE_VERSIONS[pkg]:  # an older download of another version in ROOT/debs
            raise SystemExit(f"error: {deb} is version {versions[pkg]}, pinned {PACKAGE_VERSIONS[pkg]}; "
                             f"remove {debs} and fetch again")
        subprocess.run(["dpkg-deb", "-x", str(deb), str(root / pkg)], check=True)
    (root / "packages.json").write_text(json.dumps(versions, indent=1) + "\n")
    print(f"extracted {len(packages)} packages into {root}: " + ", ".join(f"{p} {v}" for p, v in versions.items()))
    return versions


def build_shards(roots: list[Path], out: Path, names: list[str], val_fraction: float, preset: int) -> dict:
    versions: dict = {}
    for r in roots:
        if (r / "packages.json").is_file():
            versions.update(json.loads((r / "packages.json").read_text()))
    stats: dict = defaultdict(lambda: {"raw_bytes": 0, "documents": 0, "validation_documents": 0})
    t0 = time.time()

    def docs():
        for d in iter_prose_documents(roots, names):
            st = stats[d.source]
            st["raw_bytes"] += len(d.text.encode("utf-8"))
            st["documents"] += 1
            st["validation_documents"] += is_validation(d.key, val_fraction)
            yield d.key, d.source, d.text

    sources = get_sources(names)
    manifest = write_shards(docs(), out, preset=preset, extra={})
    manifest["sources"] = [
        {"name": s.name, "package": s.package, "version": versions.get(s.package), "licence": s.licence,
         "description": s.description, **stats[s.name]} for s in sources if s.name in stats
    ]
    manifest["val_fraction_reported"] = val_fraction
    manifest["split"] = "by document: validation when sha1(id)[:8]/2**32 < data.val_fraction"
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"parsed and compressed in {time.time() - t0:.0f} s")
    print_table(manifest)
    return manifest


def print_table(manifest: dict) -> None:
    print(f"{'source':18s} {'package':24s} {'raw MB':>8s} {'docs':>7s} {'val':>5s}  licence")
    for s in manifest["sources"]:
        print(f"{s['name']:18s} {s['package']:24s} {s['raw_bytes'] / 1e6:8.1f} {s['documents']:7d} "
              f"{s['validation_documents']:5d}  {s['licence']}")
    raw = sum(s["raw_bytes"] for s in manifest["sources"])
    print(f"{'total':18s} {'':24s} {raw / 1e6:8.1f} {manifest['total_documents']:7d}")
    comp = manifest["total_bytes"]
    print(f"shards: {len(manifest['shards'])} files, {comp / MIB:.1f} MiB xz ({manifest['total_raw_bytes'] / MIB:.1f} "
          f"MiB JSONL, ratio {manifest['total_raw_bytes'] / comp:.2f}); 64 MiB transfers needed: "
          f"{transfers([s['bytes'] for s in manifest['shards']])}")


def transfers(sizes: list[int], budget: int = TRANSFER - 4 * MIB) -> int:
    """First-fit count of transfers of at most ``budget`` bytes (4 MiB left for the tokenizer and the tree)."""
    bins: list[int] = []
    for s in sorted(sizes, reverse=True):
        for i, b in enumerate(bins):
            if b + s <= budget:
                bins[i] += s
                break
        else:
            bins.append(s)
    return len(bins)


def build_tokenizer(out: Path, vocab: int, val_fraction: float, measure_token_shards: bool,
                    tdir: Path | None = None) -> None:
    t0 = time.time()
    corpus = text_dir_corpus([out], val_fraction)
    print(corpus.describe())
    tok = train_bpe_tokenizer(corpus.train, vocab)
    tdir = tdir or Path(f"configs/tokenizers/prose-bpe{vocab}")
    tok.save_pretrained(str(tdir))
    print(f"BPE {len(tok)} tokens trained on the train split in {time.time() - t0:.0f} s -> {tdir}")
    t0 = time.time()
    train = encode_documents(tok, corpus.train)
    val = encode_documents(tok, corpus.validation)
    n_bytes = corpus.n_bytes
    info = {"vocab": len(tok), "train_tokens": int(len(train)), "validation_tokens": int(len(val)),
            "bytes_per_token": n_bytes / (len(train) + len(val)), "val_fraction": val_fraction,
            "trained_on": "train split of the shards whose manifest.json has this sha256",
            "manifest_sha256": hashlib.sha256((out / "manifest.json").read_bytes()).hexdigest()}
    print(f"encoded in {time.time() - t0:.0f} s: {len(train):,} train + {len(val):,} validation tokens, "
          f"{info['bytes_per_token']:.2f} bytes/token")
    if measure_token_shards:
        blob = lzma.compress(np.concatenate([train, val]).astype(np.uint16).tobytes(), preset=9)
        info["uint16_xz_bytes"] = len(blob)
        text_xz = json.loads((out / "manifest.json").read_text())["total_bytes"]
        print(f"uint16 token stream: {2 * (len(train) + len(val)) / MIB:.1f} MiB raw, {len(blob) / MIB:.1f} MiB xz "
              f"(text shards: {text_xz / MIB:.1f} MiB xz)")
    (tdir / "corpus_tokens.json").write_text(json.dumps(info, indent=1) + "\n")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("step", choices=["fetch", "shards", "tokenizer", "all"])
    ap.add_argument("--root", action="append", type=Path, help="package root(s) (default / for shards)")
    ap.add_argument("--out", type=Path, default=Path("build/prose"), help="shard folder")
    ap.add_argument("--sources", nargs="*", default=[], help="source names (default: all)")
    ap.add_argument("--val-fraction", type=float, default=0.05)
    ap.add_argument("--vocab", type=int, default=8192, help="BPE vocab size (8192 default, 16384 option)")
    ap.add_argument("--tokenizer-dir", type=Path, help="where to save it (default configs/tokenizers/prose-bpeN)")
    ap.add_argument("--xz-preset", type=int, default=9)
    ap.add_argument("--measure-token-shards", action="store_true", help="also measure xz of uint16 token ids")
    args = ap.parse_args(argv)
    roots = args.root or [Path("/")]
    if args.step in ("fetch", "all"):
        if not args.root:
            ap.error("fetch needs --root DIR (the packages are extracted there, not installed)")
        fetch(roots[0], args.sources)
    if args.step in ("shards", "all"):
        build_shards(roots, args.out, args.sources, args.val_fraction, args.xz_preset)
    if args.step in ("tokenizer", "all"):
        build_tokenizer(args.out, args.vocab, args.val_fraction, args.measure_token_shards, args.tokenizer_dir)


if __name__ == "__main__":
    main()
