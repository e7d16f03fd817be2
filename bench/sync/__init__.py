"""bench.sync: syncing a boot image and its edited versions between appliances, vs rsync."""
