"""benchmarks/decode_attention_ops.py on the CPU (the Triton interpreter, tiny shapes): every swept launch
configuration agrees with the reference, and the results file is written."""

import json

import pytest

from hybrid_attention.ops.common.triton import HAS_TRITON, interpreting


@pytest.mark.skipif(not (HAS_TRITON and interpreting()), reason="needs triton under TRITON_INTERPRET=1")
def test_decode_attention_ops_dryrun(tmp_path):
    from benchmarks import decode_attention_ops

    decode_attention_ops.main(["--dryrun", "--out", str(tmp_path)])
    res = json.loads((tmp_path / "decode_attention_ops.json").read_text())
    rows = res["correctness"]
    assert rows and all(r["ok"] for r in rows), [r for r in rows if not r["ok"]]
    assert {r["block_n"] for r in rows} == set(decode_attention_ops.BLOCKS)
    assert {r["two_ranges"] for r in rows} == {False, True}
    assert res["sweep"] == []  # CUDA only
