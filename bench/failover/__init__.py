"""Failover gap: kill -9 the active appliance, time the first OFFER from the new one."""
