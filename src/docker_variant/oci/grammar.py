"""The distribution grammar of repository names, tags, digests and registry hosts: one home
for every layer that checks them (references, index documents, the proxy's routes, the
scheduler's image names). Pure: no I/O, no httpx.

Each ``*_problem`` function returns what is wrong, or ``None``. Two guarantees hold for
every one of them, whatever the text (a request path, a placement, a command line):

- lengths are checked before any pattern runs, so a 10,000-character name costs one
  ``len()``;
- every pattern repeats only with possessive quantifiers (``++``, ``*+``) over pieces that
  start with disjoint characters, so the matcher never backtracks into a repetition and a
  match costs time linear in the text (``[-]*`` inside a repeated group, as distribution's
  own pattern is written, is exponential in Python's backtracking matcher).
"""

from __future__ import annotations

import ipaddress
import re

__all__ = [
    "DIGEST_MAX",
    "DIGEST_RULE",
    "NAME_MAX",
    "NAME_RULE",
    "PATTERNS",
    "REGISTRY_RULE",
    "TAG_MAX",
    "TAG_RULE",
    "digest_problem",
    "domain_problem",
    "is_digest",
    "name_problem",
    "registry_problem",
    "tag_problem",
]

#: distribution's NameTotalLengthMax: a repository name (with its registry) is at most this.
NAME_MAX = 255
#: The longest tag: one word character and 127 more.
TAG_MAX = 128
#: The longest digest any rule here accepts (``sha512:`` and 128 hex digits is 135).
DIGEST_MAX = 1024

# A path component: alphanumeric runs joined by '.', '_', '__' or a run of '-'. A
# separator never starts with an alphanumeric character, so each run is taken whole.
_COMPONENT = r"[a-z0-9]++(?:(?:[._]|__|-++)[a-z0-9]++)*+"
_NAME_RE = re.compile(rf"{_COMPONENT}(?:/{_COMPONENT})*+")
NAME_RULE = "lowercase components [a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)* joined by '/'"

TAG_RULE = r"[\w][\w.-]{0,127}"
_TAG_RE = re.compile(r"\w[\w.-]{0,127}+", re.ASCII)

# As Docker parses a reference: an algorithm of letter-led components, hex encoded.
_REFERENCE_DIGEST_RE = re.compile(
    r"[A-Za-z][A-Za-z0-9]*+(?:[-_+.][A-Za-z][A-Za-z0-9]*+)*+:[0-9a-fA-F]{32,}+"
)
# The image spec's general form ``algorithm:encoded``, for documents and routes.
_SPEC_DIGEST_RE = re.compile(r"[a-z0-9]++(?:[+._-][a-z0-9]++)*+:[a-zA-Z0-9=_-]++")
# The image spec's registered algorithms: lowercase hex of a fixed length.
_REGISTERED_LENGTHS = {"sha256": 64, "sha512": 128}
_LOWER_HEX_RE = re.compile(r"[a-f0-9]++")
DIGEST_RULE = "algorithm:encoded, sha256 with 64 (sha512 with 128) lowercase hex digits"

# A DNS label run (no leading or trailing '-'), dotted, or a bracketed IPv6; a port.
_DOMAIN_COMPONENT = r"[a-zA-Z0-9]++(?:-++[a-zA-Z0-9]++)*+"
_DOMAIN_RE = re.compile(
    rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*+|\[[a-fA-F0-9:]++\])(?::[0-9]++)?+"
)

# A registry named on its own (``--registry``, a hosts directory): a DNS name of labels of
# at most 63 characters, an IPv4 address or a bracketed IPv6 address, and a port.
_REGISTRY_RE = re.compile(
    r"(?:\[(?P<ipv6>[0-9A-Fa-f:.]++)\]|(?P<host>[A-Za-z0-9.-]++))(?::(?P<port>[0-9]++))?+"
)
_HOST_LABEL_RE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,62}+(?<=[A-Za-z0-9]))?+")
REGISTRY_RULE = "host[:port] (a DNS name, an IPv4 address or an [IPv6] address; port 1-65535)"

#: Every pattern above, for the test that checks they cannot backtrack.
PATTERNS: tuple[re.Pattern[str], ...] = (
    _NAME_RE,
    _TAG_RE,
    _REFERENCE_DIGEST_RE,
    _SPEC_DIGEST_RE,
    _LOWER_HEX_RE,
    _DOMAIN_RE,
    _REGISTRY_RE,
    _HOST_LABEL_RE,
)


def name_problem(name: str) -> str | None:
    """A repository path (``team/app``): at most ``NAME_MAX`` characters of ``NAME_RULE``."""
    if not isinstance(name, str) or not name:
        return "repository name is empty"
    if len(name) > NAME_MAX:
        return f"repository name is {len(name)} characters, longer than {NAME_MAX}"
    if name != name.lower():
        return f"repository name {name!r} must be lowercase"
    if not _NAME_RE.fullmatch(name):
        return f"repository name {name!r} must be {NAME_RULE}"
    return None


def tag_problem(tag: str) -> str | None:
    if not isinstance(tag, str) or len(tag) > TAG_MAX or not _TAG_RE.fullmatch(tag):
        shown = tag if not isinstance(tag, str) or len(tag) <= TAG_MAX else tag[:TAG_MAX] + "..."
        return f"tag {shown!r} does not match {TAG_RULE}"
    return None


def digest_problem(digest: str, *, strict: bool = True) -> str | None:
    """``strict``: as Docker parses a reference (letter-led algorithm, hex, at least 32
    digits); else the image spec's ``algorithm:encoded``. Either way the registered
    algorithms need their own length of lowercase hex (``sha256:zz`` is no digest)."""
    if not isinstance(digest, str):
        return f"digest {digest!r} is not {DIGEST_RULE}"
    if len(digest) > DIGEST_MAX:
        return f"digest {digest[:72]!r}... is longer than {DIGEST_MAX} characters"
    pattern = _REFERENCE_DIGEST_RE if strict else _SPEC_DIGEST_RE
    if not pattern.fullmatch(digest):
        if strict:
            return f"digest {digest!r} is not algorithm:hex (at least 32 hex digits)"
        return f"digest {digest!r} is not algorithm:encoded (e.g. sha256:<64 hex digits>)"
    algorithm, _, encoded = digest.partition(":")
    length = _REGISTERED_LENGTHS.get(algorithm)
    if length is not None and (len(encoded) != length or not _LOWER_HEX_RE.fullmatch(encoded)):
        return f"digest {digest!r}: {algorithm} needs {length} lowercase hex digits"
    return None


def domain_problem(domain: str) -> str | None:
    """A reference's registry part, ``host[:port]`` (a port 1-65535)."""
    if len(domain) > NAME_MAX or not _DOMAIN_RE.fullmatch(domain):
        shown = domain if len(domain) <= NAME_MAX else domain[:NAME_MAX] + "..."
        return f"registry {shown!r} is not a valid host[:port]"
    port = domain.rpartition("]")[2].rpartition(":")[2] if ":" in domain else ""
    if port and not (len(port) <= 5 and 1 <= int(port) <= 65535):
        return f"registry {domain!r}: port {port} is not 1-65535"
    return None


def registry_problem(registry: str) -> str | None:
    """A registry as a host directory or an allow-list names it: ``REGISTRY_RULE``."""
    match = _REGISTRY_RE.fullmatch(registry) if len(registry) <= NAME_MAX else None
    valid = match is not None
    if match is not None and match["ipv6"] is not None:
        try:
            ipaddress.IPv6Address(match["ipv6"])
        except ValueError:
            valid = False
    elif match is not None:
        host = match["host"]
        valid = len(host) <= 253 and all(_HOST_LABEL_RE.fullmatch(p) for p in host.split("."))
    if valid and match is not None and match["port"] is not None:
        port = match["port"]
        valid = len(port) <= 5 and 1 <= int(port) <= 65535
    if not valid:
        shown = registry if len(registry) <= NAME_MAX else registry[:NAME_MAX] + "..."
        return f"registry {shown!r} is not {REGISTRY_RULE}"
    return None


def is_digest(reference: str) -> bool:
    """Whether a manifest reference (``/manifests/<reference>``) names a digest, not a tag."""
    return ":" in reference
