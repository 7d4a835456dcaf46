"""`python -m router.cli`: the `tidegate` command."""

from router.cli.main import main

raise SystemExit(main())
