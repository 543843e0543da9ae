"""specconv: convert, validate and publish speculative-decoding drafters."""
__version__ = "0.1.0"
