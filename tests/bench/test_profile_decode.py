"""benchmarks/profile_decode runs end to end on the CPU (--dryrun: the tiny preset, CPU op times) and prints its
header and kernel table, so that GPU time is not spent on a bug in it."""

from __future__ import annotations

from benchmarks.profile_decode import main


def test_dryrun_prints_a_report(capsys):
    main(["--dryrun", "--context", "8", "--steps", "2", "--top", "3", "--fused-gemv", "both"])
    out = capsys.readouterr().out
    assert "### tiny B=1 ctx=8 (dry run" in out and "### tiny B=1 ctx=8 fused-gemv (dry run" in out
    assert "failed" not in out
    assert "| kernel | calls/step | ms/step | share |" in out
    # the plain variant's top ops are aten ops; the fused one (the fused kernels, interpreted) may show its own ops
    rows = [line for line in out.splitlines() if line.startswith("| ") and not line.startswith("| kernel |")]
    assert len(rows) == 6 and sum(line.startswith("| aten::") for line in rows) >= 3


def test_log_compile_prints_every_phase(capsys):
    """--log-compile (the diagnostics for the fused variant's H200 timeout): a start and an end line per phase, the
    counters and the Triton JIT column; under the interpreter the dry run's fused variant runs the fused kernels."""
    main(["--dryrun", "--context", "8", "--steps", "2", "--top", "3", "--fused-gemv", "on", "--log-compile",
          "--stack-dump-s", "0"])
    out = capsys.readouterr().out
    assert "failed" not in out
    tag = "[log-compile] tiny B=1 ctx=8 fused-gemv: "
    for phase in ("model", "decoder", "first step (compile + Triton JIT + run)", "warm-up and timed steps",
                  "profiled steps"):
        assert f"{tag}{phase}: start" in out
        assert any(line.startswith(f"{tag}{phase}: ") and " s wall; " in line and "triton JIT compiles" in line
                   for line in out.splitlines()), phase
    assert f"{tag}fused_mlp=True use_kernels=True compile=False" in out
    assert f"{tag}first timed steps (ms): [" in out
