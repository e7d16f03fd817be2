"""The DHCP relay plugin (docs/relay.md)."""
