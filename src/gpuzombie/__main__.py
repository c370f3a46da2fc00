"""``python -m gpuzombie`` runs the CLI."""

from gpuzombie.cli.main import main

raise SystemExit(main())
