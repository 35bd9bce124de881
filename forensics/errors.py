"""The toolkit's errors: one hierarchy, each class a kind of problem a user can act on."""

from __future__ import annotations


class KvfError(Exception):
    """Base of every error the toolkit reports to its user."""


class InputNotFound(KvfError):
    """A path given to ingest does not exist."""


class UnrecognisedFile(KvfError):
    """A file is not in any format the toolkit reads."""


class UnreadableFile(KvfError):
    """A file cannot be opened or decoded."""


class FileChanged(UnreadableFile):
    """A file was written or truncated while it was ingested."""


class CaseLocked(KvfError):
    """The case database is open in another process."""


class CaseError(KvfError):
    """The case database is missing, damaged or from an incompatible version."""


class QueryError(KvfError):
    """A query over the case was refused or failed."""


class OutputExists(KvfError):
    """An output folder that is not empty: nothing is overwritten."""


class OutputRefused(KvfError):
    """An output path that is not a regular file (a folder, a device, a FIFO, a link): not written."""


class BadOption(KvfError):
    """A command option outside what it admits."""


class BadValue(BadOption):
    """An option's value that no case could make right (a pool smaller than one page): a usage error."""


class EngineMissing(KvfError):
    """An engine the command needs is not installed here (PySpark, Java)."""


class SparkFailed(KvfError):
    """Spark failed a job: what failed, in one line (``--debug`` shows Spark's own report)."""
