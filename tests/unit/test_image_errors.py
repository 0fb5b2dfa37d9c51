"""What a failed build of a sandbox image says, from its log's tail.

The lines are those of a real `tooljail images build python --scientific` on a
host whose PyPI is reached through a TLS-intercepting proxy the build does not
trust (a full build takes minutes: this checks the words, not docker).
"""

from __future__ import annotations

from tooljaild.sandbox.images.build import explain_failure

ENGINE = "The command '/bin/sh -c set -eux; ...' returned a non-zero code: 1"
PIP_TAIL = [
    "+ python3 -m pip install --no-cache-dir --break-system-packages numpy pandas matplotlib scipy",
    "WARNING: Retrying (Retry(total=0, connect=None, read=None, redirect=None, status=None)) "
    "after connection broken by 'SSLError(SSLCertVerificationError(1, '[SSL: "
    "CERTIFICATE_VERIFY_FAILED] certificate verify failed: self-signed certificate in "
    "certificate chain (_ssl.c:992)'))': /simple/numpy/",
    "Could not fetch URL https://pypi.org/simple/numpy/: There was a problem confirming the "
    "ssl certificate: HTTPSConnectionPool(host='pypi.org', port=443): Max retries exceeded",
    "ERROR: Could not find a version that satisfies the requirement numpy (from versions: none)",
    "ERROR: No matching distribution found for numpy",
]


def test_a_scientific_build_without_pypi_says_pip_failed_and_the_way_out() -> None:
    said = explain_failure(ENGINE, PIP_TAIL, {"SCIENTIFIC": "1"})
    assert said.startswith("pip could not install the scientific packages")
    assert "from PyPI (the build does not trust the index's TLS certificate" in said
    assert "Could not fetch URL https://pypi.org/simple/numpy/" in said
    assert "[sandbox] python = ..." in said
    assert said.endswith(f"The engine said: {ENGINE}")


def test_an_index_that_does_not_answer_at_all_is_named_without_certificate_words() -> None:
    tail = [
        "WARNING: Retrying ... Failed to establish a new connection: [Errno 111] Connection "
        "refused')': /simple/numpy/",
        PIP_TAIL[-2],
        PIP_TAIL[-1],
    ]
    said = explain_failure(ENGINE, tail, {"SCIENTIFIC": "1"})
    assert said.startswith("pip could not install the scientific packages (numpy, pandas")
    assert "TLS" not in said
    assert "Could not find a version that satisfies the requirement numpy" in said


def test_apt_failures_and_other_errors() -> None:
    apt = explain_failure(ENGINE, ["E: Unable to locate package python3-pip"], {"SCIENTIFIC": "1"})
    assert apt.startswith("apt-get could not reach a Debian mirror: E: Unable to locate")
    # The plain variant installs nothing from PyPI: the engine's words stand.
    assert explain_failure(ENGINE, PIP_TAIL, {}) == ENGINE
    assert explain_failure(ENGINE, ["something else"], {"SCIENTIFIC": "1"}) == ENGINE
