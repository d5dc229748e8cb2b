"""The user-input error of the library (data, checkpoints, model folders): a one-line explanation of what is wrong.

A leaf module, so that data, checkpoints and the CLI share it without importing each other."""


class DataError(ValueError):
    """Raised for an empty corpus, an unreadable file, a missing optional dependency or a tokenizer/model mismatch."""
