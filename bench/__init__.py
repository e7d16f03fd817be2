"""Side-by-side benchmarks of Rackboot against the real peers (not timed tests).

Each benchmark is a package run as ``python -m bench.<name>``; see bench/README.md.
"""
