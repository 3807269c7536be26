"""A vLLM simulator: engine model, HTTP server, KV event publisher, fleet, discrete-event mode."""
