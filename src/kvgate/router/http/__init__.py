"""HTTP I/O around the routing core: the ASGI app, the proxy to the pods, the pods' client,
the load scraper and the admin API."""
