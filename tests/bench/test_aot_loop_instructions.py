"""``benchmarks.aot_regs_gdn.loop_instructions``: the size of a kernel's largest loop in SASS text."""

import pytest

pytest.importorskip("triton")

from benchmarks.aot_regs_gdn import loop_instructions  # noqa: E402

SASS = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/              @!P0 BRA `(.L_x_0) ;
.L_x_1:
        /*0020*/                   FMUL R2, R2, R3 ;
        /*0030*/                   HGMMA.64x16x16.F32 R24, gdesc[UR4], R24 ;
        /*0040*/                   IADD3 R4, R4, 0x1, RZ ;
.L_x_2:
        /*0050*/                   ISETP.GE.AND P1, PT, R4, R5, PT ;
        /*0060*/               @P1 BRA `(.L_x_2) ;
        /*0070*/               @P0 BRA `(.L_x_1) ;
.L_x_0:
        /*0080*/                   EXIT ;
        /*0090*/                   BRA `(.L_x_3);
.L_x_3:
"""


def test_largest_backward_branch_span():
    # the outer loop .L_x_1 spans 0x20..0x70 (6 instructions); the inner one 2; forward branches are no loops
    assert loop_instructions(SASS) == 6


def test_no_loop():
    straight = "\n".join(line for line in SASS.splitlines() if "@P0 BRA `(.L_x_1)" not in line
                         and "@P1 BRA" not in line)
    assert loop_instructions(straight) == 0
