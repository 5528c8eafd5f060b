"""Network scenario presets (TOML), loadable by name with ``Scenario.load(name)``."""
