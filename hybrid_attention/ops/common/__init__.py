"""Code shared by the complex diagonal-SSM ops (Interdomain Attention, the S4D-only control, the bilinear S4D baseline).

``ssm``: the pure-PyTorch helpers every one of them uses (input validation, dtype policy, parameter casts, chunk
decay tables). ``triton``: the chunked state scans (forward scan, reverse adjoint scan, state-carry gradient) that
the Interdomain op and the bilinear S4D op both run; the linear S4D op is an FFT convolution and uses only ``ssm``.
Op-specific code (readouts, the chunk-local kernels) stays in each op's package.
"""
