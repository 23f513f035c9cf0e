"""swapspec's pytest entry point: load the plugin (target selection, profiles, report)."""

pytest_plugins = ["properties.plugin"]
