"""P21 by content: a private key under a name that does not look secret (bso.git_rules.holds_private_key)."""

from __future__ import annotations

import json
import re

import pytest

from bso.git_rules import PRIVATE_KEY_LINE, holds_private_key

BODY = "MIIEowIBAAKCAQEAx8fK3a2TvVQ3y5mL1KJ0cP7k8Wq9b0oZ1f2Yc3d4e5f6g7h8i9j0\nk1l2m3n4o5p6q7r8s9t0u1v2w3x4y5z6A7B8C9D0E1F2G3H4I5J6K7L8M9N0O1P2Q3\n"
PEM = f"-----BEGIN RSA PRIVATE KEY-----\n{BODY}-----END RSA PRIVATE KEY-----\n"
OPENSSH = (
    "-----BEGIN OPENSSH PRIVATE KEY-----\n"
    "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW\n"
    "-----END OPENSSH PRIVATE KEY-----\n"
)
ENCRYPTED = (
    "-----BEGIN RSA PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\nDEK-Info: AES-128-CBC,088E2F2D498C44D8ABFE8A2D61BE4625\n\n"
    + BODY + "-----END RSA PRIVATE KEY-----\n"
)
PGP = (
    "-----BEGIN PGP PRIVATE KEY BLOCK-----\nVersion: GnuPG v2\nComment: a test key\n\n"
    "lQOYBF8AAAABCADJ3a2TvVQ3y5mL1KJ0cP7k8Wq9b0oZ1f2Yc3d4e5f6g7h8i9j0k1\n-----END PGP PRIVATE KEY BLOCK-----\n"
)


@pytest.mark.parametrize(
    "text",
    [
        PEM,
        PEM.replace("RSA ", ""),  # PKCS#8
        PEM.replace("RSA", "EC"),
        PEM.replace("RSA", "ENCRYPTED"),
        PEM.replace("\n", "\r\n"),
        OPENSSH,
        ENCRYPTED,
        PGP,
        "notes before it\n\n" + PEM + "and after\n",
        json.dumps({"tls": {"key": PEM}}),  # inside a string of a config file, its newlines escaped
        f"KEY = '''{PEM}'''\n",
    ],
    ids=["pem", "pkcs8", "ec", "pkcs8-encrypted", "crlf", "openssh", "encrypted-headers", "pgp", "among-text",
         "json-string", "python-string"],
)
def test_a_private_key_is_seen_whatever_its_file(text: str) -> None:
    assert holds_private_key(text)
    assert re.search(PRIVATE_KEY_LINE, text)  # (git's search, which finds the files read, finds it too)


@pytest.mark.parametrize(
    "text",
    [
        # Code that parses keys names their first line: no secret.
        'if line.startswith("-----BEGIN RSA PRIVATE KEY-----"):\n    return parse(lines)\n',
        'MARKERS = ["-----BEGIN PRIVATE KEY-----", "-----BEGIN OPENSSH PRIVATE KEY-----"]\n',
        "-----BEGIN PRIVATE KEY-----\n...\n-----END PRIVATE KEY-----\n",  # a placeholder in the docs
        PEM.replace("PRIVATE", "PUBLIC"),
        PEM.replace("RSA PRIVATE KEY", "CERTIFICATE"),
        "a private key belongs in a vault, not in the repository\n",
        "",
    ],
    ids=["parser", "markers", "placeholder", "public-key", "certificate", "prose", "empty"],
)
def test_what_only_names_a_key_is_no_key(text: str) -> None:
    assert not holds_private_key(text)
