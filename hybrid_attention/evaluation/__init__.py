"""Evaluation: perplexity and bits per byte, length sweeps, recall accuracy (MQAR, passkey), lm-eval adapter.

Import the submodules directly (``from hybrid_attention.evaluation.perplexity import evaluate_lm``). Evaluation
imports nothing from training; training calls it as its hooks (tests/test_import_graph.py checks both).
"""
