"""The lowest layer: what every other package may import, and which imports nothing else of ours.

errors (exceptions and the one exit-code table), states (the one run-state enum), paths (the run
dir layout), registry (lazy plug-in lookup), ports and net (per-job port blocks, listening
sockets), http_server (one background aiohttp server lifecycle), rendezvous (the files through which
a job's nodes meet, and record which of them failed). Standard library only at import
time; the import-linter contracts in pyproject.toml keep it that way.
"""
