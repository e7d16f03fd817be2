"""Builds the flashable Debian image of the appliance and its signed update bundles
(image/README.md, docs/updates.md)."""
