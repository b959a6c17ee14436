"""API tokens: random secrets shown once; only their sha256 digest is stored or compared."""

from __future__ import annotations

import hashlib
import secrets

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


def user_for_token(session: Session, token: str) -> User | None:
    row = session.scalar(
        select(ApiToken).where(
            ApiToken.token_hash == hash_token(token), ApiToken.revoked.is_(False)
        )
    )
    return row.user if row is not None else None
