"""Adapters that put countersign in front of the tools of agent frameworks: each maps the
framework's own way of pausing for approval onto the door (docs/sdk-python.md "Adapters").
Each lives in a module of its own, imported by name, so that a framework is needed only by
the application that uses it."""
