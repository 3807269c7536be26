"""The indexer: KV-event subscriptions to every ready pod, following discovery, feeding the
directory. Runs embedded in the router or alone (`kvgate indexer`) writing to Redis."""
