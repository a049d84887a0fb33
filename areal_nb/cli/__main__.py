"""`python -m areal_nb.cli ...` is the `areal-nb` command."""

from areal_nb.cli import main

raise SystemExit(main())
