"""benchmarks/profile_decode runs end to end on the CPU (--dryrun: the tiny preset, CPU op times) and prints its
header and kernel table, so that a device call is not spent on a bug in it."""

from __future__ import annotations

from benchmarks.profile_decode import main


def test_dryrun_prints_a_report(capsys):
    main(["--dryrun", "--context", "8", "--steps", "2", "--top", "3", "--fused-gemv", "both"])
    out = capsys.readouterr().out
    assert "### tiny B=1 ctx=8 (dry run" in out and "### tiny B=1 ctx=8 fused-gemv (dry run" in out
    assert "failed" not in out
    assert "| kernel | calls/step | ms/step | share |" in out
    assert len([line for line in out.splitlines() if line.startswith("| aten::")]) == 6
