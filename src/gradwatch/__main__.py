"""`python -m gradwatch` runs the command line."""

from gradwatch.cli import main

main()
