"""P21 by content: a private key under a name that does not look secret (bso.git_rules.holds_private_key)."""

from __future__ import annotations

import json
import re

import pytest

from bso.git_rules import (
    _PRIVATE_KEY,
    PRIVATE_KEY_CHANGE,
    PRIVATE_KEY_LINE,
    PRIVATE_KEY_LONGEST_MATCH,
    holds_private_key,
)

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
SLASHED = PEM.replace("MIIEow", "MIIE/ow/")
# A key kept as one string literal a line, as code embeds it.
PYTHON_LINES = "KEY = (\n" + "".join(f'    "{line}\\n"\n' for line in PEM.splitlines()) + ")\n"
PHP_LINES = "$key =\n" + " .\n".join(f'    "{line}\\n"' for line in PEM.splitlines()) + ";\n"
PYTHON_BYTES_LINES = "KEY = (\n" + "".join(f'    b"{line}\\n"\n' for line in PEM.splitlines()) + ")\n"
JAVA_LINES = "String key =\n" + " +\n".join(f'    "{line}\\n"' for line in PEM.splitlines()) + ";\n"
PGP = (
    "-----BEGIN PGP PRIVATE KEY BLOCK-----\nVersion: GnuPG v2\nComment: a test key\n\n"
    "lQOYBF8AAAABCADJ3a2TvVQ3y5mL1KJ0cP7k8Wq9b0oZ1f2Yc3d4e5f6g7h8i9j0k1\n-----END PGP PRIVATE KEY BLOCK-----\n"
)
SSH2 = (
    "---- BEGIN SSH2 ENCRYPTED PRIVATE KEY ----\nSubject: bso\nComment: \"2048-bit rsa, bso@example\"\n"
    "P2/56wAAA+sAAAA3aWYtbW9kbntzaWdue3JzYS1wa2NzMS1zaGExfSxlbmNyeXB0e3JzYS1wa2NzMXYyLW9hZXB9fQAAAARub25lAAADog\n"
    "---- END SSH2 ENCRYPTED PRIVATE KEY ----\n"
)
PUTTY = (
    "PuTTY-User-Key-File-3: ssh-ed25519\nEncryption: none\nComment: bso@example\nPublic-Lines: 2\n"
    "AAAAC3NzaC1lZDI1NTE5AAAAIOb6r8z9N1o2b3c4d5e6f7g8h9i0j1k2l3m4n5o6p7q8\nr9s0\nPrivate-Lines: 1\n"
    "AAAAIFh4Yw1bYzR0c3VwZXJzZWNyZXRrZXlfbm90X3JlYWxseV9idXRfbG9uZw==\nPrivate-MAC: 0123abcd\n"
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
        json.dumps({"key": SLASHED}).replace("/", "\\/"),  # JSON may escape its slashes
        PYTHON_LINES,
        JAVA_LINES,
        PHP_LINES,
        'PRIVATE_KEY: "' + " ".join(PEM.splitlines()) + '"\n',  # an env var's value, its newlines turned to spaces
        PYTHON_BYTES_LINES,
        json.dumps({"settings": json.dumps({"key": ENCRYPTED})}),  # JSON kept inside a JSON string: `\\n`
        json.dumps({"settings": json.dumps({"key": SLASHED}).replace("/", "\\/")}),
        SSH2,
        PUTTY,
        SSH2.replace('"2048-bit rsa, bso@example"', '"rsa-key-20240926 deploy key for the production, do n\\\nnot share"'),
        json.dumps({"key": SSH2}),  # its quoted comment escaped
        "KEY = (\n" + "".join(f"    {json.dumps(line + chr(10))}\n" for line in SSH2.splitlines()) + ")\n",
        json.dumps({"key": PGP.replace("a test key", "https://keybase.io/download")}).replace("/", "\\/"),
    ],
    ids=["pem", "pkcs8", "ec", "pkcs8-encrypted", "crlf", "openssh", "encrypted-headers", "pgp", "among-text",
         "json-string", "python-string", "json-escaped-slashes", "python-line-literals", "java-line-literals",
         "php-line-literals", "newlines-as-spaces", "python-bytes-line-literals", "json-in-a-json-string",
         "json-in-a-json-string-escaped-slashes", "ssh2", "putty", "ssh2-header-continued", "ssh2-json-string",
         "ssh2-python-line-literals", "pgp-url-comment-json-escaped-slashes"],
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
        PUTTY.split("Private-Lines")[0],  # a .ppk's public part
        SSH2.replace("ENCRYPTED PRIVATE", "PUBLIC"),
        'if line.startswith("Private-Lines: "):\n    count = int(line.split()[1])\n',
        "a private key belongs in a vault, not in the repository\n",
        "",
    ],
    ids=["parser", "markers", "placeholder", "public-key", "certificate", "putty-public-part", "ssh2-public-key",
         "putty-parser", "prose", "empty"],
)
def test_what_only_names_a_key_is_no_key(text: str) -> None:
    assert not holds_private_key(text)


HEADER = "-----BEGIN RSA PRIVATE KEY-----\n"


@pytest.mark.timeout(5)
@pytest.mark.parametrize(
    "text",
    [
        HEADER + "a: 1 " * 2000,  # a header's value and the blank after it took the same spaces: 25 took 11 s
        HEADER + "a: 1 \n" * 2000,
        HEADER + "a: 1   '\" \n  \"' " * 2000,
        HEADER + " \n\\n'\",+" * 3000,
        HEADER * 3000,
        "-----BEGIN " + "A " * 20000,
        (HEADER + "a: 1\n" + "x" * 39 + "\n") * 1000,
        "k: -----BEGIN PRIVATE KEY-----\n" * 20_000,  # each BEGIN read the others as its headers: 200 KB took 12 s
        (HEADER + "\\\\\\n b'\\\\\\/" * 300 + "x" * 39 + "\n") * 100,  # escapes, bytes literals, escaped slashes
        "Private-Lines: 1\n" * 20_000,
        # Just short of a body (39 `+`), one separator, again: each BEGIN read the lines after it as its headers.
        (("Private-Lines: 1\n" + ("+" * 39 + ",") * 6 + "+" * 15) * 5000)[: 1 << 20],
        ("k: ---- BEGIN SSH2 ENCRYPTED PRIVATE KEY ----\n" + ("+" * 39 + ",") * 6 + "+" * 15) * 5000,
        ("Private-Lines: 1\n" + "\\\\\\\"b'" * 80 + "\n") * 4000,
    ],
    ids=["header-spaces", "header-lines", "header-quotes", "separators", "begin-lines", "begin-words", "short-bodies",
         "begin-lines-as-header-values", "escapes", "putty-lines", "putty-lines-and-separators",
         "ssh2-begin-lines-as-header-values", "putty-lines-and-escapes"],
)
def test_a_text_built_to_make_the_search_backtrack_is_no_key_at_once(text: str) -> None:
    """Each of these is given up in milliseconds; backtracking over the ways to split them would take years (the
    timeout fails the test long before)."""
    assert not holds_private_key(text)


def test_a_line_of_key_body_alone_is_a_change_git_shows_for_reading() -> None:
    """`git log -G` sees only the lines a commit changed: a body written under a BEGIN line committed before."""
    assert re.search(PRIVATE_KEY_CHANGE, BODY, re.MULTILINE)
    assert not re.search(PRIVATE_KEY_CHANGE, "def parse(text):\n    return text.split()\n", re.MULTILINE)


def test_no_key_is_longer_than_the_overlap_a_stream_read_in_blocks_keeps() -> None:
    """Every part of the armour at its longest (words on the BEGIN line, separators, headers, escapes) is still a
    key, and its match is within PRIVATE_KEY_LONGEST_MATCH (a longer one would be missed across a block's end)."""
    between = "\\\\\\n" * 256  # (three backslashes and an n, 256 times)
    header = "H" + "h" * 64 + ": " + '\\\\\\"' * 512 + "\\\\\\n" + between  # (escaped quotes in its value)
    longest = ("-----BEGIN " + "A" * 16 + " " + "B" * 16 + " " + "C" * 16 + " " + "D" * 16 + " PRIVATE KEY BLOCK-----"
               + between + header * 16 + "\\\\\\/" * 40 + "\n")
    match = _PRIVATE_KEY.search("x" * 100 + longest)
    assert match is not None and match.end() - match.start() <= PRIVATE_KEY_LONGEST_MATCH
    assert PRIVATE_KEY_LONGEST_MATCH - (match.end() - match.start()) < 64  # (the bound is that text, near enough)
