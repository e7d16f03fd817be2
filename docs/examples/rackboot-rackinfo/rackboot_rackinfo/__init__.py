"""rackinfo: a template Rackboot plugin (docs/plugin-authoring.md builds it step by step)."""
