"""`python -m hoverfly` = the `hoverfly` command."""

from hoverfly.cli import main

raise SystemExit(main())
