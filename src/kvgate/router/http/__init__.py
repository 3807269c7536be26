"""HTTP to the pods, as I/O around the routing core: the proxy, the pods' client, the usage
reader and the load scraper."""
