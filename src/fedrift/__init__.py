"""fedrift."""
