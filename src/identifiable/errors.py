"""One exception type for every error a user can act on."""


class IdentifiableError(ValueError):
    """A problem with the user's input or environment, with a message that says what to do.

    It subclasses `ValueError` so that code written against the usual Python convention
    (`except ValueError`) also catches a bad argument given to this library.
    The CLI prints it on one line and exits with status 2; it never shows a traceback.
    `cli=`: the same message worded for the command line (flags instead of Python
    argument names), which the CLI prints instead (`for_cli`).
    """

    def __init__(self, *args: object, cli: str | None = None) -> None:
        super().__init__(*args)
        self.cli = cli

    def for_cli(self) -> str:
        """The message as the CLI shows it."""
        return self.cli or str(self)


def seconds(t: float) -> str:
    """A duration for a message: whole seconds from 10 s up, two significant digits
    below, so that a short estimate is never printed as "0 s"."""
    return f"{t:.0f} s" if t >= 10 else f"{t:.2g} s"
