"""The error classes raised in one folder and caught or re-raised in others: at the bottom of the
package, so that the ops, the shard readers, the sources and the recipes share them without importing
one another. Each names what it is about (a sample, a file, a transform) and what to do, its text
scrubbed of credentials (:class:`~dali_bridge.util.urls.Scrubbed`)."""
from __future__ import annotations

from typing import Sequence

from .util.quoting import safe_name
from .util.urls import Scrubbed, redact
from .util.wording import problem_list


class ImageError(Scrubbed, ValueError):
    """The bytes are not a readable image; the message is the reason users see."""


class SourceError(Scrubbed, ValueError):
    """The source cannot be listed: missing or empty root, malformed or dangling file-list lines."""


class SampleError(Scrubbed, RuntimeError):
    """A sample could not be read or decoded (``on_error: raise``): names its index, file and reason."""

    def __init__(self, index: int, path: str, reason: str):
        self.index, self.path, self.reason = index, redact(path), redact(reason)
        super().__init__(f"sample {index} ({safe_name(path)}): {reason}")

    def __reduce__(self):   # pickled (to or from a worker process) as its three parts
        return type(self), (self.index, self.path, self.reason)


class RecipeError(Scrubbed, ValueError):
    """A transform, a timm argument or a spec that cannot be converted; ``problems`` lists each one."""

    def __init__(self, problems: Sequence[str], source: str = "recipe"):
        self.problems = list(problems)
        self.source = source
        super().__init__(problem_list(source, self.problems))
