"""Built-in scoring plugins, one folder each (code, typed ``Params``, README).

Filters: ``healthy``, ``load-bound``, ``affinity-cap``. Scorers: ``prefix-cache``,
``queue-depth``, ``kv-cache-usage``, ``predicted-ttft``. Pickers: ``near-equal``, ``round-robin``.

Re-implementations of the peers' plugins (``kvgate.scoring.peer_policies``): filters
``prefix-cache-affinity`` (llm-d), ``load-imbalance`` and ``load-stddev`` (AIBrix); scorers
``token-load`` (llm-d), ``gie-prefix-cache`` and ``waiting-queue`` (Gateway API Inference
Extension), ``kv-block-cost`` (Dynamo), ``match-minus-load`` (vLLM production-stack),
``match-percent`` (AIBrix); picker ``softmax`` (Dynamo).

They are registered by :func:`kvgate.scoring.registry.default_registry`.
"""
