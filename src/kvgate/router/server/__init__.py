"""The router's HTTP server: the ASGI app (OpenAI endpoints, /metrics, /debug, /admin) over a
running `RouterRuntime`."""
