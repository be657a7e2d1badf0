"""The exporter's errors: main() prints them and exits 1, having written nothing."""


class ExportError(Exception):
    """A problem with the user's module or arguments; main() prints it and exits 1."""


class AmbiguousSizes(ExportError):
    """An integer that the second trace's sizes cannot attribute to one product of B and T."""
