"""Join tokens: one copy-pasteable string, checked before any I/O; secrets honoured once."""

from __future__ import annotations

import pytest

from appliance.cluster.jointoken import PREFIX, Token, TokenBook, TokenError, decode_untrusted

NOW = 1_800_000_000.0


def make(expires: float = NOW + 3600, addresses=("192.0.2.10:7470",)) -> Token:
    return Token(
        "0123456789abcdef", bytes(range(32)), b"tid45678", b"s" * 16, int(expires), addresses
    )


def test_roundtrip_and_shape():
    token = make(addresses=("192.0.2.10:7470", "rack1-a.example:7470"))
    text = token.encode()
    assert text.startswith(PREFIX) and text.isascii() and " " not in text and len(text) < 200
    assert decode_untrusted(text, NOW) == token
    # Wrapped by a terminal or pasted with a newline: still the same token.
    assert decode_untrusted(f"  {text[:30]}\n{text[30:]}\n", NOW) == token


def test_expired_token_is_refused_with_its_age():
    with pytest.raises(TokenError, match="expired 10 s ago"):
        decode_untrusted(make(expires=NOW - 10).encode(), NOW)


@pytest.mark.parametrize(
    ("mangle", "reason"),
    [
        (lambda t: "xyz" + t, "not a rackboot join token"),
        (lambda t: t[:-3], "checksum|base64url"),
        (lambda t: t[:10] + ("A" if t[10] != "A" else "B") + t[11:], "checksum"),
        (lambda t: t + "A" * 3000, "longer than"),
        (lambda t: PREFIX + "!!!", "base64url|checksum"),
    ],
)
def test_mangled_tokens_are_refused(mangle, reason):
    with pytest.raises(TokenError, match=reason):
        decode_untrusted(mangle(make().encode()), NOW)


def test_bad_fields_are_refused():
    bad = Token("NOT-HEX", bytes(32), b"tid45678", b"s" * 16, int(NOW + 60), ("a:1",))
    with pytest.raises(TokenError, match="cluster id"):
        decode_untrusted(bad.encode(), NOW)
    bad = Token("0123456789abcdef", bytes(32), b"tid45678", b"s" * 16, int(NOW + 60), ("no port",))
    with pytest.raises(TokenError, match="member address"):
        decode_untrusted(bad.encode(), NOW)


def test_book_honours_a_token_once():
    book = TokenBook()
    expires = book.issue(b"tid45678", b"s" * 16, NOW, 600)
    assert expires == int(NOW + 600) and book.outstanding(NOW) == 1
    assert "s" * 16 not in str(book.to_plain())  # only the hash is stored
    with pytest.raises(TokenError, match="secret does not match"):
        book.redeem(b"tid45678", b"x" * 16, NOW, by="n1")
    book.redeem(b"tid45678", b"s" * 16, NOW + 1, by="n1")
    with pytest.raises(TokenError, match="already used .by node n1"):
        book.redeem(b"tid45678", b"s" * 16, NOW + 2, by="n2")
    # The consumption survives persistence.
    again = TokenBook.from_plain(book.to_plain())
    with pytest.raises(TokenError, match="already used"):
        again.redeem(b"tid45678", b"s" * 16, NOW + 2, by="n2")
    with pytest.raises(TokenError, match="unknown join token"):
        again.redeem(b"other123", b"s" * 16, NOW, by="n2")


def test_book_refuses_an_expired_token_and_prunes_it():
    book = TokenBook()
    book.issue(b"tid45678", b"s" * 16, NOW, 60)
    with pytest.raises(TokenError, match="expired"):
        book.redeem(b"tid45678", b"s" * 16, NOW + 61, by="n1")
    book.prune(NOW + 61)
    assert book.entries == {} and book.outstanding(NOW + 61) == 0


def test_book_from_garbage_is_empty():
    assert TokenBook.from_plain("junk").entries == {}
    assert TokenBook.from_plain({"tokens": {"a": {"hash": 1}}}).entries == {}
