"""CLI start-up and query times: Rackboot's ``rackboot`` beside Kea's ``kea-shell``."""
