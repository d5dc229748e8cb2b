"""Functional token-mixing ops: pure math on tensors, no nn.Module, no parameters."""
