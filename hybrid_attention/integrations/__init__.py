"""Adapters that let the library's layers run inside other libraries' model code (``fla``: flash-linear-attention)."""
