"""Runs as pictures: what to draw (panels), what was collected (series), and how it is rendered.

Nothing here imports matplotlib at module level: only PNG output needs it (`gradwatch[plot]`).
"""
