"""Firmware updates of the appliance: signed slot bundles, the A/B slot state
machine, and the slot writer (docs/updates.md)."""
