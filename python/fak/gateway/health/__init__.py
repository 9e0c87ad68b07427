"""``GET /health``."""
