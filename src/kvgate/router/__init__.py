"""The ASGI router: classify, tokenize, look up, choose, proxy, learn."""
