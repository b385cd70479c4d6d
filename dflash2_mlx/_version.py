"""The package's version, in a module of its own: the package, its modules and the build
(pyproject's dynamic version) read it here."""

__version__ = "0.1.0"
