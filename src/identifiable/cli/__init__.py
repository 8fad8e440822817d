"""The `identifiable` command line.

Each command lives in its own module with a `register(app)` function. What a user can
get wrong ends with one line on stderr and exit status 2, never a traceback:

- `IdentifiableError` (bad input, missing file, unusable folder): `error: …`;
- usage errors (unknown command or option, missing or malformed argument, a bare
  `identifiable`): a usage line, a hint and `Error: …`, at most three lines;
- an argument that is not valid UTF-8 (the shell passed raw bytes): refused, naming the
  argument and the byte position (texts are never silently altered).

Ctrl-C exits with status 130 after one line (`reproduce` adds "rerun with --resume").
"""

from __future__ import annotations

import importlib
import os
import sys
import warnings
from typing import Annotated, Any

import typer

from identifiable.errors import IdentifiableError


def _click_class(name: str) -> type[Any]:
    """Click's exception class `name`, found from typer's public `BadParameter`.

    typer up to 0.2x raises the `click` package's exceptions; later releases vendor click
    under a private module. Both make `typer.BadParameter` a subclass of click's
    `UsageError` and `ClickException`, so their classes are read from its MRO rather
    than imported from either place."""
    for cls in typer.BadParameter.__mro__:
        if cls.__name__ == name:
            return cls
    raise ImportError(f"typer {typer.__version__}: no click {name} above typer.BadParameter")


UsageError = _click_class("UsageError")
ClickException = _click_class("ClickException")

COMMAND_MODULES = (
    "trace",
    "attention",
    "tokens",
    "attribution",
    "mixing",
    "certify",
    "posterior",
    "reproduce",
    "scan",
    "view",
    "finetune",
    "compare",
)

app = typer.Typer(
    name="identifiable",
    help="How far can you trust what a Transformer's attention and hidden states seem to say?",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        from identifiable import __version__

        print(f"identifiable {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """How far can you trust what a Transformer's attention and hidden states seem to say?"""


def _register_all() -> None:
    if getattr(app, "_identifiable_registered", False):
        return  # main() may run many times in one process (tests)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(f"identifiable.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"identifiable.cli.{name}":
                continue  # command not part of this build
            raise
        module.register(app)
    app._identifiable_registered = True  # type: ignore[attr-defined]


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    print(f"warning: {message}", file=sys.stderr)


def check_utf8(argv: list[str]) -> None:
    """Refuse an argument the shell passed as bytes that are not UTF-8.

    Python keeps such bytes as lone surrogates (PEP 383); tokenizers and JSON cannot
    take them, and replacing them would analyse a text the user did not write.
    """
    for number, arg in enumerate(argv, start=1):
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            raw = os.fsencode(arg)
            try:
                raw.decode("utf-8")
                position, byte = 0, 0  # not reachable: fsencode gave back invalid bytes
            except UnicodeDecodeError as exc:
                position, byte = exc.start, raw[exc.start]
            raise IdentifiableError(
                f"argument {number} is not valid UTF-8 (byte 0x{byte:02x} at byte offset "
                f"{position}); pass UTF-8 text, e.g. convert it with iconv"
            ) from None


def _usage(exc: Any) -> None:
    """At most three lines: usage, where to get help, what was wrong."""
    ctx = exc.ctx
    if type(exc).__name__ == "NoArgsIsHelpError":  # click >= 8.2: a bare `identifiable`
        message = "missing command."
    else:
        message = exc.format_message()
    if ctx is not None:
        print(ctx.get_usage().strip().splitlines()[0], file=sys.stderr)
        print(f"Try '{ctx.command_path} --help' for help.", file=sys.stderr)
    print(f"Error: {' '.join(message.split())}", file=sys.stderr)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the `identifiable` script.

    stdout and stderr are written through `channels.guarded`: a console that cannot show a
    character gets an ASCII spelling (≤ as <=), and a failed write (a full disk behind
    `> file`) ends the command with one line instead of a traceback."""
    from identifiable.cli.channels import guarded

    with guarded():
        _main(argv)


def _main(argv: list[str] | None) -> None:
    from identifiable.cli.common import Interrupted

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    warnings.showwarning = _one_line_warning
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        check_utf8(args)
        _register_all()
        rc = app(args=args, prog_name="identifiable", standalone_mode=False)
    except IdentifiableError as exc:
        print(f"error: {' '.join(exc.for_cli().split())}", file=sys.stderr)
        sys.exit(2)
    except Interrupted as exc:
        print(str(exc), file=sys.stderr)
        sys.exit(130)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    except UsageError as exc:
        _usage(exc)
        sys.exit(2)
    except ClickException as exc:
        print(f"Error: {' '.join(exc.format_message().split())}", file=sys.stderr)
        sys.exit(2)
    except typer.Abort:
        print("aborted", file=sys.stderr)
        sys.exit(1)
    except MemoryError:
        print(
            "error: out of memory; use a smaller input, a smaller --budget or a machine "
            "with more memory",
            file=sys.stderr,
        )
        sys.exit(2)
    if rc == 130:  # typer turns Ctrl-C inside a command into exit code 130
        print("interrupted", file=sys.stderr)
    if isinstance(rc, int) and rc:
        sys.exit(rc)
