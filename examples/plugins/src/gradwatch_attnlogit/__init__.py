"""An example gradwatch plugin: a detector for a metric gradwatch does not know, and a parser for a
trainer gradwatch does not know, both found through this package's entry points (pyproject.toml).
"""
