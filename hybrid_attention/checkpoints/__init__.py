"""What a run writes and what is loaded back: step checkpoints, their integrity checks, model-folder admission.

Training writes and resumes them, evaluation loads them; neither side imports the other for it. Import the submodules
directly (``from hybrid_attention.checkpoints.step_checkpoints import newest_intact``).
"""
