"""A PBS-style launcher plug-in for the tests: its own spec section, rules and a rendered qsub script."""
