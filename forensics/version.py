"""The toolkit's version, as installed (package metadata), for the evidence manifest and reports."""

from __future__ import annotations

from importlib import metadata

try:
    __version__ = metadata.version("kvforensics")
except metadata.PackageNotFoundError:  # run from a checkout that was never installed
    __version__ = "0+unknown"
