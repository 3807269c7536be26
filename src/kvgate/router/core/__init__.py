"""The routing core: one request's lifecycle (classify, keys, decide, account, learn) as plain
code with explicit hooks, driven by the HTTP layer live and by the discrete-event bench."""
