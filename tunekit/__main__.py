"""`python -m tunekit`: the `tunekit` command."""

from tunekit.cli import main

main()
