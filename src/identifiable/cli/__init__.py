"""The `identifiable` command line.

Each command lives in its own module with a `register(app)` function; errors a
user can act on are `IdentifiableError`s, shown as one line with exit status 2.
"""

from __future__ import annotations

import importlib
import os
import sys
import warnings

import typer

from identifiable.errors import IdentifiableError

COMMAND_MODULES = (
    "trace",
    "attention",
    "tokens",
    "attribution",
    "mixing",
    "certify",
    "reproduce",
    "view",
)

app = typer.Typer(
    name="identifiable",
    help="How far can you trust what a Transformer's attention and hidden states seem to say?",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _register_all() -> None:
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(f"identifiable.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"identifiable.cli.{name}":
                continue  # command not part of this build
            raise
        module.register(app)


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    print(f"warning: {message}", file=sys.stderr)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the `identifiable` script."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    warnings.showwarning = _one_line_warning
    _register_all()
    try:
        rc = app(args=argv, standalone_mode=False)
    except IdentifiableError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    except SystemExit:
        raise
    except Exception as exc:  # click usage errors arrive here in non-standalone mode
        import click

        if isinstance(exc, click.exceptions.ClickException):
            exc.show()
            sys.exit(exc.exit_code)
        if isinstance(exc, click.exceptions.Abort):
            sys.exit(1)
        raise
    if isinstance(rc, int) and rc:
        sys.exit(rc)
