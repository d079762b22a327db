"""The package version, kept here so reading it costs no metadata scan on the warm path."""

__version__ = "0.1.0"
