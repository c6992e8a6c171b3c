"""A rollout-backend plug-in for the tests: its own spec section, rules and preview (no engine runs)."""
