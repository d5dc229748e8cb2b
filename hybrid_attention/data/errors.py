"""The one exception type of the data package: a user-facing, one-line explanation of what is wrong with the data."""


class DataError(ValueError):
    """Raised for an empty corpus, an unreadable file, a missing optional dependency or a tokenizer/model mismatch."""
