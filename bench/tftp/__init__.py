"""bench.tftp: TFTP download throughput, Rackboot vs tftpd-hpa and atftpd (see bench/README.md)."""
