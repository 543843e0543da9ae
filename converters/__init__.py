"""Source-format converters (installed as specconv.converters)."""
