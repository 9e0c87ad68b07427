"""``POST /v1/completions``: protocol (schemas), serving (engine mode), routes."""
