class MediaStreamError(Exception):
    pass


class MediaStreamTrack:
    kind = "audio"

    def __init__(self, *args, **kwargs):
        pass
