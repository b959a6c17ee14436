"""`conspo-lab token create` stores the token in the database CONSPO_DATABASE_URL names, says
which, and refuses a database the server never migrated (its token would never be read)."""

from __future__ import annotations

from pathlib import Path

from tests.support import embedded_env, lab_cli, token_from


def test_token_create_names_its_database_and_refuses_an_unmigrated_one(tmp_path: Path) -> None:
    env = embedded_env(tmp_path)
    refused = lab_cli(env, "token", "create", "--user", "alice")
    assert refused.returncode == 1 and not token_from(refused.stdout)
    assert f"sqlite:///{tmp_path / 'conspo.db'} holds no ConSPO Lab tables" in refused.stderr
    assert "Traceback" not in refused.stderr

    assert lab_cli(env, "migrate").returncode == 0
    made = lab_cli(env, "token", "create", "--user", "alice")
    assert made.returncode == 0, made.stderr
    assert token_from(made.stdout) == made.stdout.strip()  # stdout is the token alone
    assert f"token for 'alice' stored in sqlite:///{tmp_path / 'conspo.db'}" in made.stderr
