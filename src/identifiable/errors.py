"""One exception type for every error a user can act on."""


class IdentifiableError(Exception):
    """A problem with the user's input or environment, with a message that says what to do.

    The CLI prints it on one line and exits with status 2; it never shows a traceback.
    """
