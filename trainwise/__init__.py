"""trainwise: controlled trials of training strategies, measured honestly."""

__version__ = "0.1.0"
