"""DHCPv4 DORA throughput: perfdhcp against Kea, dnsmasq and Rackboot in one run.

``python -m bench.dhcp --help``; the method is described in bench/README.md.
"""
