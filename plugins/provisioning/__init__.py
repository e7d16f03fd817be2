"""The provisioning plugin (docs/provisioning.md)."""
