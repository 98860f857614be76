"""Detectors and parsers from outside gradwatch: found, checked, and kept from breaking a run.

- `registry`: where each registered class came from, and the checks every registration shares.
- `loader`: installed packages' entry points (`gradwatch.detectors`, `gradwatch.parsers`) and the
  Python files under `plugins:` in the config, each imported once per process.
- `guard`: a plugin's instances run behind a guard; its first exception is reported, not raised.
- `failures`: those reports, one line each on stderr; any of them makes the exit code 2.

The public face for plugin authors is `gradwatch.api`. This package imports nothing at import
time, because the registries import it.
"""
