"""The work behind each CLI command, kept out of cli.py so it can be tested and reused."""
