"""What every command shares: the exit statuses, the spec options (``--set``, ``--data``), the list of
backends an option names, the checks of a path to write."""
from __future__ import annotations

import argparse
import difflib
import os
from pathlib import Path
from typing import Any, Callable

from ..spec.overrides import parse_overrides
from ..spec.pipeline import PipelineSpec, load_spec
from ..util.urls import is_url


EXIT_FAILED = 1      # the job ran and failed (a bad sample, a comparison outside its bounds)
EXIT_INVALID = 2     # invalid pipeline, source or arguments
EXIT_UNAVAILABLE = 3  # an explicitly requested backend cannot run here
EXIT_BROKEN_PIPE = 141  # stdout closed by the reader (`| head`): what a shell reports for SIGPIPE
# One function per command module: each receives build_parser's `add` (name, handler, help, epilog → subparser).
AddCommand = Callable[..., argparse.ArgumentParser]


class UsageError(SystemExit):
    """A command-line argument found invalid after parsing: its message was printed; exit status 2,
    as argparse's own errors. ``str()`` is the message."""

    def __init__(self, message: str):
        super().__init__(message)
        self.code = EXIT_INVALID


def set_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The --set flags (and --data) as overrides whose problems name the flag."""
    overrides = parse_overrides(args.set or [])
    if getattr(args, "data", None):
        # A URL stays one (the spec says what reads objects at a URL); a local folder is made absolute.
        root = args.data if is_url(args.data) else str(Path(args.data).resolve())
        overrides["source"] = {"type": "folder", "root": root}
    return overrides


def load_with_options(path: str, args: argparse.Namespace) -> PipelineSpec:
    return load_spec(path, set_overrides(args))


def add_spec_options(parser: argparse.ArgumentParser, data: bool = True) -> None:
    parser.add_argument("--set", action="append", metavar="KEY=VALUE",
                        help="override a key by dotted path, value read as YAML (repeatable), "
                             "e.g. --set batch_size=32 --set source.root=/data/train")
    if data:
        parser.add_argument("--data", metavar="DIR",
                            help="image folder to read instead of the pipeline's source (ImageFolder layout)")


def backend_list(text: str) -> list[str]:
    from ..loader.select import BACKEND_NAMES, available_backends

    if text == "available":
        return available_backends()
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in BACKEND_NAMES + ("auto",)]
    if unknown:
        hints = [f"did you mean '{match[0]}' for '{name}'?" for name in unknown
                 if (match := difflib.get_close_matches(name, BACKEND_NAMES + ("auto", "available"), n=1))]
        raise SystemExit(f"dali-bridge: unknown backend(s) {', '.join(unknown)} "
                         f"(expected {', '.join(BACKEND_NAMES)}, auto or available)" + "".join(f"; {h}" for h in hints))
    return names


def check_writable_file(path: str, flag: str) -> None:
    """Refuse (exit 2) an output file that cannot be written, before the work that fills it: it is
    opened for appending (created if absent, then removed), so a missing folder, a directory in its
    place or a read-only file system are found now rather than after a long run."""
    existed = os.path.lexists(path)
    try:  # without blocking: a FIFO in the file's place is refused, not waited on
        os.close(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK, 0o666))
    except OSError as exc:
        raise SystemExit(f"dali-bridge: {flag} {path}: cannot write it: {exc.strerror or exc}") from None
    if not existed:
        os.remove(path)


def check_writable_folder(path: str, flag: str) -> None:
    """Refuse (exit 2) an output folder that cannot be made or written, before the work that fills it:
    the folder, or the nearest existing one above it, must take a new file."""
    import tempfile

    folder = Path(path).absolute()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise SystemExit(f"dali-bridge: {flag} {path}: {folder} is not a folder")
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise SystemExit(f"dali-bridge: {flag} {path}: cannot write in {folder}: {exc.strerror or exc}") from None
