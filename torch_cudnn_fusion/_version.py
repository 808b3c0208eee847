"""The package version, read by pyproject.toml (setuptools) and by the package: one source."""

__version__ = "0.1.0"
