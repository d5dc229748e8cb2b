"""Code shared by the complex diagonal-SSM ops (Interdomain Attention, the S4D-only control, the bilinear S4D baseline).

``ssm``: the pure-PyTorch helpers every one of them uses (input validation, dtype policy, parameter casts, chunk
decay tables). Op-specific code (readouts, the chunk-local kernels) stays in each op's package.
"""
