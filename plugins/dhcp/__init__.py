"""The DHCP plugin: DHCPv4 server for PXE racks (codec, lease table, server machine)."""
