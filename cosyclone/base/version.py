"""The package version, here so that every layer can name it without importing the package root
(which loads the API)."""

__version__ = "0.1.0"
