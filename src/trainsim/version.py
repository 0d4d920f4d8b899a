"""The installed trainsim's version (the root package re-exports it; low layers import it from here)."""

__version__ = "0.1.0"
