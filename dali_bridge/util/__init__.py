"""Utilities every layer may use and that use nothing of the project: value checks, UTF-8 text, quoted
names, counted wording, brace patterns, sizes, dtypes, exact math, progress lines, one intra-op thread,
and URLs with the one scrubber every message about a location passes through."""
