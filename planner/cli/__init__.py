"""The ``planner`` command: each sub-command parses, calls the library, renders."""
