"""``python -m llamacpy`` is the ``llamacpy`` command."""

from .cli import main

raise SystemExit(main())
