"""Importing this module fails."""
import fxwrap_plugin_fixtures_missing_dependency  # noqa: F401
