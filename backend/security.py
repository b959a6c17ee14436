"""API tokens: random secrets shown once; only their sha256 digest is stored or compared.

A token also signs short-lived tickets: a link the browser follows by itself (a download) cannot
send an Authorization header, so the page asks, with its token, for a URL that carries a ticket
instead. A ticket names its token's row, an expiry and one purpose ("export 7 last"), signed
with HMAC keyed on the token's stored digest: no secret beyond the database, valid on every API
process, forged by no one who has neither the token nor the database, and dead with its token
(revoked or deleted) or at its expiry."""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time

from sqlalchemy import select
from sqlalchemy.orm import Session

from backend.models import ApiToken, User

TOKEN_PREFIX = "csp_"


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def get_or_create_user(session: Session, name: str, *, admin: bool = False) -> User:
    user = session.scalar(select(User).where(User.name == name))
    if user is None:
        user = User(name=name, is_admin=admin)
        session.add(user)
        session.flush()
    elif admin and not user.is_admin:
        user.is_admin = True
    return user


def create_token(
    session: Session, user_name: str, *, admin: bool = False, label: str | None = None
) -> str:
    """Create (or promote) the user and a fresh token for it; returns the plaintext once."""
    user = get_or_create_user(session, user_name, admin=admin)
    token = new_token()
    session.add(ApiToken(user_id=user.id, token_hash=hash_token(token), label=label))
    session.commit()
    return token


def _token_row(session: Session, token: str) -> ApiToken | None:
    return session.scalar(
        select(ApiToken).where(
            ApiToken.token_hash == hash_token(token), ApiToken.revoked.is_(False)
        )
    )


def user_for_token(session: Session, token: str) -> User | None:
    row = _token_row(session, token)
    return row.user if row is not None else None


TICKET_TTL_S = 300  # a download link: followed at once by the page that asked for it
_MAX_ROW_ID = 2**31 - 1  # a larger id is no row (and an out-of-range bind on PostgreSQL)
_TICKET = re.compile(
    r"(?P<token>[0-9]{1,10})\.(?P<expires>[0-9]{1,12})\.(?P<signature>[0-9a-f]{64})"
)


def _signature(token_hash: str, purpose: str, token_id: int, expires: int) -> str:
    message = f"{purpose}|{token_id}|{expires}".encode()
    return hmac.new(token_hash.encode(), message, hashlib.sha256).hexdigest()


def ticket_for(
    session: Session, token: str, purpose: str, ttl_s: float = TICKET_TTL_S
) -> str | None:
    """A ticket for ``purpose`` signed by ``token`` ("<token id>.<expiry>.<hmac>"), valid for
    ``ttl_s`` seconds; None when the token is not a live one."""
    row = _token_row(session, token)
    if row is None:
        return None
    expires = int(time.time() + ttl_s)
    return f"{row.id}.{expires}.{_signature(row.token_hash, purpose, row.id, expires)}"


def user_for_ticket(session: Session, ticket: str, purpose: str) -> User | None:
    """The user whose live token signed ``ticket`` for exactly ``purpose``, before its expiry;
    else None (malformed, expired, another purpose, a revoked token, a wrong signature)."""
    parts = _TICKET.fullmatch(ticket)
    if parts is None or int(parts["token"]) > _MAX_ROW_ID or int(parts["expires"]) < time.time():
        return None
    row = session.get(ApiToken, int(parts["token"]))
    if row is None or row.revoked:
        return None
    expected = _signature(row.token_hash, purpose, row.id, int(parts["expires"]))
    return row.user if hmac.compare_digest(parts["signature"], expected) else None
