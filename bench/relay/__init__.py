"""DHCP relay throughput: perfdhcp's clients through Rackboot's relay and ISC dhcrelay to Kea.

``python -m bench.relay --help``; the method is described in bench/README.md.
"""
