"""`python -m tunekit.cli` (what fleet workers and tests/gpu scripts run): the `tunekit` command."""

from tunekit.cli import main

main()
