from omnivoice.engine.detokenizer import IncrementalDetokenizer


class ByteTokenizer:
    """Each token is one UTF-8 byte; decoding replaces broken sequences like real byte-level BPE."""

    def decode(self, ids, skip_special_tokens=True, clean_up_tokenization_spaces=False):
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


def test_multibyte_characters_are_never_split() -> None:
    text = "héllo wörld ✓ done"
    ids = list(text.encode())
    d = IncrementalDetokenizer(ByteTokenizer())
    out = "".join(d.add([i]) for i in ids) + d.flush()
    assert out == text
    assert d.count == len(ids)


def test_special_tokens_produce_no_text() -> None:
    d = IncrementalDetokenizer(ByteTokenizer())
    assert d.add([300]) == ""
    assert d.add(list(b"ok")) == "ok"
    assert d.flush() == ""
