"""cgc's version: the package's (``pyproject.toml`` reads it from here), the one an artifact's
manifest records, the one ``cgc --version`` prints."""

__version__ = "0.1.0"
