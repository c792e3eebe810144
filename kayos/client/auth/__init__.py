"""What a client proves to a cluster that holds credentials (docs/security.md): its credential,
from a file named by the caller or by ``KAYOS_CREDENTIALS``."""

from kayos.client.auth.credentials import (
    CREDENTIALS_ENV,
    ClientCredential,
    CredentialSource,
    credential_from,
    load_credential,
)

__all__ = [
    "CREDENTIALS_ENV",
    "ClientCredential",
    "CredentialSource",
    "credential_from",
    "load_credential",
]
