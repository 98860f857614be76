"""gradwatch: reads training logs and raises alerts before a run loses days of GPU time."""

__version__ = "0.1.0"
__all__ = ["__version__"]
