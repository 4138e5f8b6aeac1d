"""The ``dali-bridge`` command line: :mod:`~dali_bridge.cli.main` builds the parser and dispatches;
each command is a thin layer over the library functions the tests call."""
