"""Authorization for the in-process servers of the unit tests: a policy file and a static
token per identity (:func:`static_auth`), and the call metadata that authenticates as one
(:func:`as_identity`). Plaintext is fine in process: the token travels as metadata."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import yaml

from services.runtime.auth import AuthSettings


def static_auth(directory: Path, identities: Mapping[str, Sequence[str]]) -> AuthSettings:
    """Authorization on, from a policy file (``identities``) and a static token per
    identity (:func:`token_of`), written under ``directory``."""
    policy, tokens = directory / "policy.yaml", directory / "tokens.yaml"
    policy.write_text(yaml.safe_dump({"identities": {k: list(v) for k, v in identities.items()}}))
    tokens.write_text(yaml.safe_dump({"tokens": {name: token_of(name) for name in identities}}))
    return AuthSettings(enabled=True, policy_file=policy, identity_from="token", tokens_file=tokens)


def token_of(identity: str) -> str:
    return f"token-of-{identity}-0123456789"


def as_identity(identity: str) -> tuple[tuple[str, str], ...]:
    """Call metadata that authenticates as ``identity`` (:func:`static_auth`)."""
    return (("authorization", f"Bearer {token_of(identity)}"),)
