"""``POST /v1/messages`` and ``POST /v1/messages/count_tokens``: Anthropic's Messages API over the
shared serving base (``fak.gateway.serving``), for Claude Code and the ``anthropic`` SDK."""
