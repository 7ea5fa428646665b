"""The stand-in's exceptions: the names the server catches."""


class InvalidAccessError(Exception):
    pass


class InvalidStateError(Exception):
    pass


class OperationError(Exception):
    pass
