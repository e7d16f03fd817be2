"""The rolling update of a rack (docs/updates.md): planner, updaters, the service."""
