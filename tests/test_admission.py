"""The address a connection counts against (gateway/admission.py): pure."""

from __future__ import annotations

import pytest

from broker import errors
from gateway.admission import client_address, parse_networks

_PROXIES = parse_networks("10.0.0.0/8, 192.0.2.7")


@pytest.mark.parametrize(
    ("peer", "forwarded", "trusted", "expected"),
    [
        ("203.0.113.5", None, _PROXIES, "203.0.113.5"),
        # Not from a trusted proxy: the header is the client's word, ignored.
        ("203.0.113.5", "198.51.100.1", _PROXIES, "203.0.113.5"),
        ("203.0.113.5", "198.51.100.1", (), "203.0.113.5"),
        # From a trusted proxy: the rightmost hop that is not one of ours.
        ("10.1.2.3", "198.51.100.1", _PROXIES, "198.51.100.1"),
        ("10.1.2.3", "6.6.6.6, 198.51.100.1, 192.0.2.7", _PROXIES, "198.51.100.1"),
        ("10.1.2.3", "10.9.9.9, 10.8.8.8", _PROXIES, "10.9.9.9"),
        ("10.1.2.3", "", _PROXIES, "10.1.2.3"),
        # IPv6 counts per /64; IPv4-mapped as IPv4.
        ("2001:db8:1:2:aaaa::1", None, (), "2001:db8:1:2::/64"),
        ("2001:db8:1:2:bbbb::9", None, (), "2001:db8:1:2::/64"),
        ("::ffff:203.0.113.5", None, (), "203.0.113.5"),
        (None, None, (), "unknown"),
        ("10.1.2.3", "not-an-address", _PROXIES, "not-an-address"),
    ],
)
def test_client_address(
    peer: str | None, forwarded: str | None, trusted: tuple[object, ...], expected: str
) -> None:
    assert client_address(peer, forwarded, trusted) == expected  # type: ignore[arg-type]


def test_a_bad_trusted_proxy_is_refused_at_start() -> None:
    with pytest.raises(errors.InvalidSetting, match="RUNLOG_TRUSTED_PROXIES") as e:
        parse_networks("10.0.0.0/8, nonsense")
    assert e.value.code == "invalid_setting"
