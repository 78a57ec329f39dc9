"""``python -m llamacpy`` is the ``llamacpy`` command."""

from .cli import entry

entry()
