"""Built-in scoring plugins, one folder each (code, typed ``Params``, README).

Filters: ``healthy``, ``load-bound``, ``affinity-cap``. Scorers: ``prefix-cache``,
``queue-depth``, ``kv-cache-usage``, ``predicted-ttft``. Pickers: ``near-equal``, ``round-robin``.
They are registered by :func:`kvgate.scoring.registry.default_registry`.
"""
