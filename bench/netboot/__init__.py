"""bench.netboot: power-on to installed over the network, Rackboot vs dnsmasq + nginx."""
