"""Power plugins: they answer the provisioning_power hook for the machines whose ``power`` address names them (docs/power.md)."""
