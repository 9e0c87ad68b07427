"""``POST /v1/chat/completions``: protocol (schemas), serving (engine mode), routes."""
