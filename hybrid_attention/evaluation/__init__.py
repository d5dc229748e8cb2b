"""Evaluation: perplexity and bits per byte, length sweeps, recall tasks (MQAR, passkey), lm-eval adapter.

Import the submodules directly (``from hybrid_attention.evaluation.perplexity import evaluate_lm``); this package
imports nothing eagerly so that training and evaluation can use each other without import cycles.
"""
