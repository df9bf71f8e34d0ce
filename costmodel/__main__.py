"""``python -m costmodel``: the ``cp-plan`` command line, for an environment whose scripts are not on PATH."""

from costmodel.cli import main

raise SystemExit(main())
