"""The router advertisement plugin: answers router solicitations where no router does (docs/ra.md)."""
