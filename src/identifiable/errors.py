"""One exception type for every error a user can act on."""


class IdentifiableError(ValueError):
    """A problem with the user's input or environment, with a message that says what to do.

    It subclasses `ValueError` so that code written against the usual Python convention
    (`except ValueError`) also catches a bad argument given to this library.
    The CLI prints it on one line and exits with status 2; it never shows a traceback.
    """
