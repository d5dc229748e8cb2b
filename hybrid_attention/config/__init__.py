"""The run configuration (``config.yaml``: model, data, optim, train) and the YAML schema that reads it.

Training builds a run from it and evaluation rebuilds a saved run's model from it. Import the submodules directly
(``from hybrid_attention.config.run_config import load_config``).
"""
