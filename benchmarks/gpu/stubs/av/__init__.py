"""A stand-in for PyAV on the GPU machine (too large to carry): the names the server imports."""


class AudioFrame:
    def __init__(self, *args, **kwargs):
        raise RuntimeError("PyAV is not installed on this machine")
