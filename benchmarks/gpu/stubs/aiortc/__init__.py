"""A stand-in for aiortc on the GPU machine, which lacks it: the names the server imports, so it
starts; WebRTC itself is not served there."""


class _Missing:
    def __init__(self, *args, **kwargs):
        raise RuntimeError("aiortc is not installed on this machine")


RTCConfiguration = RTCDataChannel = RTCPeerConnection = RTCSessionDescription = RTCIceServer = _Missing
