"""trainsim: predict the performance of distributed deep-learning training before spending GPU hours."""

__version__ = "0.1.0"
