"""egress/swap.py: placeholders swapped only for their hosts; leaks refused; echoes scrubbed."""

from __future__ import annotations

import base64

import pytest

from tooljaild.egress.policy import HeldSecret
from tooljaild.egress.rules import parse_rule
from tooljaild.egress.swap import BodyLeakScanner, ResponseScrubber, SecretLeak, swap_request

NEWS = HeldSecret(
    "NEWS_API_KEY",
    "s3cr&t/v=1",
    (parse_rule("api.example.com:443"),),
    "tooljail-secret-" + "a" * 32,
)
OTHER = HeldSecret(
    "OTHER", "other-value", (parse_rule("other.example.com:443"),), "tooljail-secret-" + "b" * 32
)
SECRETS = (NEWS, OTHER)


def test_header_and_url_placeholders_swap_for_their_host() -> None:
    target, headers = swap_request(
        "GET",
        f"/news?key={NEWS.placeholder}&q=1",
        [("X-Api-Key", NEWS.placeholder), ("Authorization", f"Bearer {NEWS.placeholder}")],
        "api.example.com",
        443,
        SECRETS,
    )
    assert target == "/news?key=s3cr%26t%2Fv%3D1&q=1"
    assert headers == [("X-Api-Key", NEWS.value), ("Authorization", f"Bearer {NEWS.value}")]


def test_basic_auth_is_decoded_swapped_and_reencoded() -> None:
    creds = base64.b64encode(f"user:{NEWS.placeholder}".encode()).decode()
    _, headers = swap_request(
        "GET", "/", [("authorization", f"Basic {creds}")], "api.example.com", 443, SECRETS
    )
    scheme, encoded = headers[0][1].split(" ")
    assert scheme == "Basic"
    assert base64.b64decode(encoded).decode() == f"user:{NEWS.value}"


def test_untouched_request_is_returned_as_is() -> None:
    headers = [("Accept", "*/*")]
    assert swap_request("GET", "/", headers, "x.test", 443, SECRETS) == ("/", headers)


@pytest.mark.parametrize(
    ("target", "headers", "where"),
    [
        (f"/?k={NEWS.placeholder}", [], "url"),
        ("/?k=%74ooljail-secret-" + "a" * 32, [], "url"),
        (f"/{NEWS.placeholder}/x", [], "url"),
        ("/", [("X-Key", f"k {NEWS.placeholder}")], "header X-Key"),
        (
            "/",
            [
                (
                    "Authorization",
                    "Basic " + base64.b64encode(f"u:{NEWS.placeholder}".encode()).decode(),
                )
            ],
            "header Authorization",
        ),
    ],
)
def test_placeholder_for_another_host_is_a_leak(
    target: str, headers: list[tuple[str, str]], where: str
) -> None:
    with pytest.raises(SecretLeak) as caught:
        swap_request("GET", target, headers, "evil.example.com", 443, SECRETS)
    assert (caught.value.secret, caught.value.where) == ("NEWS_API_KEY", where)
    # Neither the value nor the placeholder is in the message.
    assert NEWS.value not in str(caught.value)
    assert NEWS.placeholder not in str(caught.value)


def test_wrong_port_is_a_leak() -> None:
    with pytest.raises(SecretLeak):
        swap_request("GET", "/", [("K", NEWS.placeholder)], "api.example.com", 8443, SECRETS)


def test_placeholder_of_another_secret_to_this_host_is_a_leak() -> None:
    with pytest.raises(SecretLeak) as caught:
        swap_request(
            "GET",
            "/",
            [("A", NEWS.placeholder), ("B", OTHER.placeholder)],
            "api.example.com",
            443,
            SECRETS,
        )
    assert caught.value.secret == "OTHER"


def test_a_value_with_a_newline_cannot_split_a_header() -> None:
    bad = HeldSecret(
        "BAD", "x\r\nX-Injected: 1", (parse_rule("h.test:443"),), "tooljail-secret-" + "c" * 32
    )
    with pytest.raises(ValueError, match="header K") as caught:
        swap_request("GET", "/", [("K", bad.placeholder)], "h.test", 443, (bad,))
    assert "Injected" not in str(caught.value)


def test_body_scanner_finds_a_placeholder_split_across_pieces() -> None:
    body = b"x" * 100 + f'{{"key": "{NEWS.placeholder}"}}'.encode()
    for cut in range(95, 140):
        scanner = BodyLeakScanner(SECRETS, "evil.example.com", 443)
        with pytest.raises(SecretLeak) as caught:
            for piece in (body[:cut], body[cut : cut + 3], body[cut + 3 :]):
                scanner.feed(piece)
        assert (caught.value.secret, caught.value.where) == ("NEWS_API_KEY", "body")


def test_body_scanner_byte_by_byte() -> None:
    scanner = BodyLeakScanner(SECRETS, "evil.example.com", 443)
    with pytest.raises(SecretLeak):
        for byte in b"a=" + NEWS.placeholder.encode():
            scanner.feed(bytes([byte]))


def test_body_scanner_lets_a_placeholder_go_to_its_own_host() -> None:
    scanner = BodyLeakScanner((NEWS,), "api.example.com", 443)
    scanner.feed(NEWS.placeholder.encode())


def test_scrubber_replaces_values_split_anywhere() -> None:
    answer = b"echo: " + NEWS.value.encode() + b" and " + OTHER.value.encode() + b"!"
    expected = b"echo: " + NEWS.placeholder.encode() + b" and " + OTHER.placeholder.encode() + b"!"
    for size in (1, 2, 3, 5, 7, 100):
        scrubber = ResponseScrubber(SECRETS)
        out = b"".join(scrubber.feed(answer[i : i + size]) for i in range(0, len(answer), size))
        assert out + scrubber.flush() == expected


def test_scrubber_percent_encoded_and_extra_pairs() -> None:
    sent = "Basic " + base64.b64encode(f"u:{NEWS.value}".encode()).decode()
    wrote = "Basic " + base64.b64encode(f"u:{NEWS.placeholder}".encode()).decode()
    scrubber = ResponseScrubber(SECRETS, extra=[(sent, wrote)])
    answer = f'{{"auth": "{sent}", "q": "s3cr%26t%2Fv%3D1"}}'.encode()
    out = scrubber.feed(answer) + scrubber.flush()
    assert NEWS.value.encode() not in out
    assert sent.encode() not in out
    assert wrote.encode() in out
    assert NEWS.placeholder.encode() in out
    assert scrubber.scrub_text(f"x={NEWS.value}") == f"x={NEWS.placeholder}"


def test_scrubber_without_secrets_passes_through() -> None:
    scrubber = ResponseScrubber(())
    assert not scrubber.active
    assert scrubber.feed(b"abc") == b"abc"
    assert scrubber.flush() == b""
