"""An example Rackboot plugin to copy: see README.md next to pyproject.toml."""
