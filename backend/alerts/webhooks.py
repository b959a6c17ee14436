"""Webhook URLs an alert may call, and the call itself.

An alert must not become a way to reach the platform's own services, so a URL is refused when
its host resolves to a loopback, private, link-local, multicast or reserved address (unless
``CONSPO_ALERT_ALLOW_PRIVATE``), or is outside ``CONSPO_ALERT_WEBHOOK_HOSTS`` when that is set;
redirects are never followed. The check runs when the rule is made and again before each call,
as a name may resolve elsewhere later (a name that changes its answer between that check and
httpx's own lookup, DNS rebinding, is not caught: set the allow-list where that matters).
"""

from __future__ import annotations

import collections
import http.client
import ipaddress
import json
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit

from backend.config import Settings

MAX_URL_CHARS = 2000
Format = Literal["slack", "discord", "json"]
FORMATS: tuple[Format, ...] = ("slack", "discord", "json")
DISCORD_MAX_CHARS = 2000  # Discord refuses longer content
SLACK_MAX_CHARS = 3000
MAX_ANSWER_BYTES = 64 * 1024  # of a webhook's answer, read and dropped


class WebhookRefused(ValueError):
    """The URL may not be called; the message says why, without the URL's secret parts."""


def redacted(url: str) -> str:
    """What may be shown of a webhook URL: its scheme and host (the path is its key)."""
    parts = urlsplit(url)
    host = parts.hostname or "?"
    port = f":{parts.port}" if _port(parts) is not None else ""
    return f"{parts.scheme}://{host}{port}/…"


def _port(parts: Any) -> int | None:
    try:
        return parts.port
    except ValueError:
        return None


def check_url(url: str, settings: Settings) -> tuple[str, int]:
    """``url``'s host and port when an alert may call it, judged without a DNS lookup (a
    literal address is judged; a name is judged at each call); raises ``WebhookRefused``."""
    if len(url) > MAX_URL_CHARS:
        raise WebhookRefused(f"longer than {MAX_URL_CHARS} characters")
    if any(c.isspace() or ord(c) < 32 for c in url):
        raise WebhookRefused("holds spaces or control characters")
    parts = urlsplit(url)
    if parts.scheme not in ("https", "http"):
        raise WebhookRefused(f"scheme {parts.scheme or '(none)'!r}: only http and https")
    if parts.username is not None or parts.password is not None:
        raise WebhookRefused("holds a user name or password: put the secret in the path")
    host = (parts.hostname or "").rstrip(".").lower()
    if not host:
        raise WebhookRefused("has no host")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise WebhookRefused("has an invalid port") from None
    allowed = [h.strip().lower() for h in settings.alert_webhook_hosts if h.strip()]
    if allowed and not any(_host_matches(host, pattern) for pattern in allowed):
        raise WebhookRefused(
            f"host {host!r} is not in this platform's webhook allow-list"
            " (CONSPO_ALERT_WEBHOOK_HOSTS)"
        )
    literal = _address(host)
    if literal is not None:
        _check_address(literal, host, settings)
    elif host == "localhost" or host.endswith(".localhost"):
        _check_address(ipaddress.ip_address("127.0.0.1"), host, settings)
    return host, port


def _host_matches(host: str, pattern: str) -> bool:
    if pattern.startswith("*."):
        return host.endswith(pattern[1:])
    return host == pattern


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def _check_address(
    address: ipaddress.IPv4Address | ipaddress.IPv6Address, host: str, settings: Settings
) -> None:
    if settings.alert_allow_private:
        return
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if not address.is_global or address.is_multicast:
        raise WebhookRefused(
            f"host {host!r} is a loopback, private, link-local or reserved address"
            f" ({address}); alerts call public hosts only (CONSPO_ALERT_ALLOW_PRIVATE)"
        )


def check_resolved(host: str, port: int, settings: Settings) -> None:
    """Every address ``host`` resolves to now is one an alert may call."""
    if settings.alert_allow_private:
        return
    try:
        infos = socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)
    except OSError as exc:
        raise WebhookRefused(f"host {host!r} does not resolve: {exc}") from None
    for info in infos:
        address = _address(str(info[4][0]).split("%", 1)[0])
        if address is not None:
            _check_address(address, host, settings)


@dataclass(frozen=True)
class Alert:
    """What a delivery says."""

    id: int  # the firing's id: a webhook that hears of it twice can tell
    rule_id: int
    rule_name: str
    run_id: int
    run_name: str
    event: str
    message: str
    step: int | None
    value: float | None
    metric: str | None
    link: str | None


def payload(alert: Alert, fmt: Format) -> dict[str, Any]:
    """The JSON body for a webhook of format ``fmt``: Slack's ``text`` (its control characters
    escaped), Discord's ``content`` (no mention pings anyone), or the alert's fields."""
    text = alert.message + (f"\n{alert.link}" if alert.link else "")
    if fmt == "slack":
        escaped = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        return {"text": escaped[:SLACK_MAX_CHARS]}
    if fmt == "discord":
        return {"content": text[:DISCORD_MAX_CHARS], "allowed_mentions": {"parse": []}}
    return {"text": text, "alert": alert.__dict__}


class CallBudget:
    """This process's webhook calls in the last minute, at most ``alert_per_minute``: the
    dispatcher's deliveries and the API's test calls draw on the same budget, so neither can
    make the platform flood a webhook."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: collections.deque[float] = collections.deque()

    def take(self, per_minute: int) -> bool:
        """Count one call now if the budget has room; False (nothing counted) if not."""
        with self._lock:
            now = time.monotonic()
            while self._calls and now - self._calls[0] > 60:
                self._calls.popleft()
            if len(self._calls) >= per_minute:
                return False
            self._calls.append(now)
            return True


CALLS = CallBudget()


@dataclass(frozen=True)
class Outcome:
    delivered: bool
    retry: bool  # worth calling again later (a timeout, a 429 or a 5xx)
    error: str | None = None


def send(url: str, body: dict[str, Any], settings: Settings) -> Outcome:
    """POST ``body`` to ``url`` once, with the checks above; the error never holds the URL."""
    try:
        host, port = check_url(url, settings)
        check_resolved(host, port, settings)
    except WebhookRefused as exc:
        return Outcome(False, False, f"refused: {exc}")
    data = json.dumps(body, allow_nan=False, default=str).encode()
    parts = urlsplit(url)
    target = parts.path or "/"
    if parts.query:
        target += f"?{parts.query}"
    # http.client, not httpx: httpx logs every request's full URL at INFO, and this one's path
    # is a secret. It follows no redirect either.
    connection_type = (
        http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    )
    connection = connection_type(host, port, timeout=settings.alert_timeout_s)
    try:
        connection.request(
            "POST",
            target,
            body=data,
            headers={"Content-Type": "application/json", "User-Agent": "conspo-lab-alerts"},
        )
        response = connection.getresponse()
        response.read(MAX_ANSWER_BYTES)
    except (OSError, http.client.HTTPException) as exc:
        return Outcome(False, True, f"{type(exc).__name__} calling {host}")
    finally:
        connection.close()
    code = response.status
    if 200 <= code < 300:
        return Outcome(True, False)
    if 300 <= code < 400:
        return Outcome(False, False, f"{host} answered {code}: redirects are not followed")
    retry = code in (408, 425, 429) or code >= 500
    return Outcome(False, retry, f"{host} answered HTTP {code}")
