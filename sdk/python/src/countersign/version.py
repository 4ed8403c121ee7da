"""The SDK's version; the package's metadata reads it from here (pyproject.toml)."""

VERSION = "0.1.0"
