"""Boot images: a signed chunk store, served by name, synced between appliances (docs/images.md)."""
