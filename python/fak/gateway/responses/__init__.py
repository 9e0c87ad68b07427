"""``POST /v1/responses`` (OpenAI Responses API) over the shared serving base, for Codex and the
``openai`` SDK's ``responses`` surface; ``GET``/``DELETE /v1/responses/{id}`` for stored ones."""
