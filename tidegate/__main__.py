"""`python -m tidegate`: the `tidegate` command."""

from tidegate.cli.main import main

raise SystemExit(main())
