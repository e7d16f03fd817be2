"""bench.http: HTTP boot downloads and boot-script requests, Rackboot vs nginx."""
