"""`python -m gradwatch` runs the command line."""

from gradwatch.cli import main

if __name__ == "__main__":  # not when a worker process imports it (gradwatch.segments)
    main()
