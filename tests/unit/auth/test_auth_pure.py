"""kayos.auth, pure: secrets and proofs (a stored key proves nothing, a proof covers its message
only), the credentials table's edits (rotation holds two secrets, an admin on * is always kept),
the nonce window (a replay is refused, a forgotten nonce's time becomes stale), the decision
(401 and 403 exactly where the rule says), and the auth half of the safe default."""

from __future__ import annotations

import pytest

from kayos import limits
from kayos.auth.keys import (
    CLUSTER_PRINCIPAL,
    Secret,
    cluster_client_key,
    cluster_stored_keys,
    make_proof,
    new_secret,
    parse_secret,
    proof_matches,
    stored_key_of,
)
from kayos.auth.proof import NonceWindow, http_authorization, verify_http
from kayos.auth.rules import HTTP_RULES, Rule, decide, http_rule, open_bind_problem
from kayos.auth.table import (
    CredentialsTable,
    add_credential,
    decode_table,
    finish_rotation,
    parse_grant_text,
    remove_credential,
    rotate_credential,
)
from kayos.errors import InvalidRequest

pytestmark = pytest.mark.unit

NOW_MS = 1_800_000_000_000
ADMIN = (parse_grant_text("admin+consume+produce=*"),)


def table_with(*names_grants: tuple[str, str]) -> tuple[CredentialsTable, dict[str, Secret]]:
    secrets = {"ops": new_secret()}
    table = add_credential(CredentialsTable(), "ops", ADMIN, secrets["ops"])
    for name, grant in names_grants:
        secrets[name] = new_secret()
        table = add_credential(table, name, (parse_grant_text(grant),), secrets[name])
    return table, secrets


def header(
    name: str,
    secret: Secret,
    method: str = "GET",
    path: str = "/v1/status",
    at: int = NOW_MS,
    nonce: bytes = b"\x01" * 16,
) -> str:
    return http_authorization(name, secret.client_key(), method, path, at, nonce)


def test_a_secret_survives_its_text_form_and_a_stored_key_makes_no_proof() -> None:
    secret = new_secret()
    again = parse_secret(secret.text())
    assert again.client_key() == secret.client_key()
    stored = secret.stored_key()
    assert proof_matches(stored, b"m", make_proof(secret.client_key(), b"m"))
    assert not proof_matches(stored, b"other", make_proof(secret.client_key(), b"m"))
    # Whoever holds only the stored key cannot prove anything with it.
    assert not proof_matches(stored, b"m", make_proof(stored, b"m"))
    assert secret.text() not in repr(secret)
    assert secret.key.hex() not in repr(secret)


@pytest.mark.parametrize("text", ["", "kc1", "kc2.50000.aa.bb", "kc1.10.00.00", "kc1.x.y.z"])
def test_a_malformed_secret_is_refused_without_repeating_it(text: str) -> None:
    with pytest.raises(InvalidRequest, match=r"kc1\.<rounds>|rounds must be"):
        parse_secret(text)


def test_rotation_holds_two_secrets_until_finished_then_only_the_new() -> None:
    table, secrets = table_with(("app", "produce=orders.*"))
    new = new_secret()
    rotating = rotate_credential(table, "app", new)
    assert rotating.version == table.version + 1
    for secret, taken_while_rotating, taken_after in (
        (secrets["app"], True, False),
        (new, True, True),
    ):
        window = NonceWindow()
        who, _ = verify_http(
            rotating, None, header("app", secret), "GET", "/v1/status", NOW_MS, window
        )
        assert (who is not None) is taken_while_rotating
        done = finish_rotation(rotating, "app")
        who, reason = verify_http(
            done,
            None,
            header("app", secret, nonce=b"\x02" * 16),
            "GET",
            "/v1/status",
            NOW_MS,
            NonceWindow(),
        )
        assert (who is not None) is taken_after, reason
    with pytest.raises(InvalidRequest, match="already rotating"):
        rotate_credential(rotating, "app", new_secret())
    with pytest.raises(InvalidRequest, match="not rotating"):
        finish_rotation(table, "app")


def test_no_edit_leaves_a_table_without_an_admin_on_every_queue() -> None:
    table, _ = table_with(("app", "produce=*"))
    with pytest.raises(InvalidRequest, match="admin"):
        remove_credential(table, "ops")
    with pytest.raises(InvalidRequest, match="admin"):
        add_credential(
            CredentialsTable(), "app", (parse_grant_text("admin=orders.*"),), new_secret()
        )
    # Removing the last credential is allowed: the cluster runs open again, as it started.
    assert remove_credential(remove_credential(table, "app"), "ops").is_open


def test_a_table_survives_its_json_and_holds_no_secret() -> None:
    table, secrets = table_with(("app", "produce+consume=orders.*"))
    raw = table.encode()
    assert decode_table(raw) == table
    for secret in secrets.values():
        assert secret.key.hex().encode() not in raw
        assert secret.client_key().hex().encode() not in raw


def test_a_replayed_nonce_is_refused_and_a_forgotten_ones_time_is_stale() -> None:
    window = NonceWindow(nonces_max=2)
    assert window.admit("a" * 32, NOW_MS, NOW_MS) is None
    assert window.admit("a" * 32, NOW_MS, NOW_MS) == "replayed"
    assert window.admit("b" * 32, NOW_MS + 1, NOW_MS) is None
    assert window.admit("c" * 32, NOW_MS + 2, NOW_MS) is None  # forgets "a"
    assert window.admit("a" * 32, NOW_MS, NOW_MS) == "stale"  # never let in twice
    too_old = NOW_MS - limits.auth_clock_skew_ms_max - 1
    assert NonceWindow().admit("d" * 32, too_old, NOW_MS) == "stale"


def test_a_proof_covers_method_path_and_query() -> None:
    table, secrets = table_with()
    good = header("ops", secrets["ops"], "GET", "/v1/status?groups=1")
    for method, path in (
        ("POST", "/v1/status?groups=1"),
        ("GET", "/v1/status"),
        ("GET", "/v1/status?groups=2"),
    ):
        who, reason = verify_http(table, None, good, method, path, NOW_MS, NonceWindow())
        assert who is None
        assert reason == "bad_proof"
    who, _ = verify_http(table, None, good, "GET", "/v1/status?groups=1", NOW_MS, NonceWindow())
    assert who is table.credentials["ops"]


def test_the_cluster_principal_proves_with_the_cluster_secret_only() -> None:
    table, _ = table_with()
    cluster_secret = b"\x07" * 32
    key = cluster_client_key(cluster_secret)
    good = http_authorization(
        CLUSTER_PRINCIPAL, key, "GET", "/v1/admin/watch", NOW_MS, b"\x03" * 16
    )
    stored = stored_key_of(key)
    who, _ = verify_http(table, stored, good, "GET", "/v1/admin/watch", NOW_MS, NonceWindow())
    assert who == CLUSTER_PRINCIPAL
    wrong = http_authorization(
        CLUSTER_PRINCIPAL,
        cluster_client_key(b"\x08" * 32),
        "GET",
        "/v1/admin/watch",
        NOW_MS,
        b"\x04" * 16,
    )
    assert verify_http(table, stored, wrong, "GET", "/v1/admin/watch", NOW_MS, NonceWindow()) == (
        None,
        "bad_proof",
    )


def test_the_cluster_principal_is_taken_under_either_secret_of_a_rotation() -> None:
    table, _ = table_with()
    old, new, other = b"\x07" * 32, b"\x09" * 32, b"\x08" * 32
    accepted = cluster_stored_keys((new, old))
    for nonce, secret, who in (
        (b"\x05", old, CLUSTER_PRINCIPAL),
        (b"\x06", new, CLUSTER_PRINCIPAL),
    ):
        proof = http_authorization(
            CLUSTER_PRINCIPAL, cluster_client_key(secret), "GET", "/v1/status", NOW_MS, nonce * 16
        )
        window = NonceWindow()
        who, _ = verify_http(table, accepted, proof, "GET", "/v1/status", NOW_MS, window)
        assert who == CLUSTER_PRINCIPAL
    stranger = http_authorization(
        CLUSTER_PRINCIPAL, cluster_client_key(other), "GET", "/v1/status", NOW_MS, b"\x0a" * 16
    )
    assert verify_http(table, accepted, stranger, "GET", "/v1/status", NOW_MS, NonceWindow()) == (
        None,
        "bad_proof",
    )


@pytest.mark.parametrize(
    ("grant", "rule", "queue", "status"),
    [
        ("produce=orders.*", Rule("produce", "queue"), "orders.eu", 200),
        ("produce=orders.*", Rule("produce", "queue"), "billing", 403),
        ("produce=orders.*", Rule("consume", "queue"), "orders.eu", 403),
        ("produce=orders.*", Rule("produce", "any"), None, 200),
        ("consume=orders.*", Rule("produce", "any"), None, 403),
        ("admin=orders.*", Rule("admin", "queue"), "orders.eu", 200),
        ("admin=orders.*", Rule("admin"), None, 403),  # every queue needs the pattern *
        ("admin+produce+consume=*", Rule("cluster"), None, 403),
        ("consume=x", Rule("open"), None, 200),
        ("consume=x", Rule("signed"), None, 200),
    ],
)
def test_decide_allows_exactly_what_the_grant_covers(
    grant: str, rule: Rule, queue: str | None, status: int
) -> None:
    table, _ = table_with(("app", grant))
    assert decide(table, table.credentials["app"], rule, queue).status == status


def test_no_credential_is_401_an_open_table_allows_all() -> None:
    table, _ = table_with()
    assert decide(table, None, Rule("produce", "queue"), "q").status == 401
    assert decide(table, None, Rule("produce", "queue"), "q", "bad_proof").reason == "bad_proof"
    assert decide(CredentialsTable(), None, Rule("admin"), None).allowed
    assert decide(table, CLUSTER_PRINCIPAL, Rule("cluster"), None).allowed


def test_a_route_missing_from_the_table_needs_admin_on_every_queue() -> None:
    assert http_rule("GET", "/v1/something-new") == Rule("admin")
    assert http_rule("HEAD", "/v1/topology") == HTTP_RULES[("GET", "/v1/topology")]


@pytest.mark.parametrize(
    ("hosts", "open_table", "insecure", "refused"),
    [
        (["127.0.0.1"], True, False, False),
        (["::1", "localhost"], True, False, False),
        (["10.0.0.1"], True, False, True),
        (["0.0.0.0"], True, False, True),  # noqa: S104 (every interface: not loopback)
        (["10.0.0.1"], True, True, False),
        (["10.0.0.1"], False, False, False),
    ],
)
def test_a_node_off_loopback_with_no_credentials_refuses_to_start(
    hosts: list[str], open_table: bool, insecure: bool, refused: bool
) -> None:
    table = CredentialsTable() if open_table else table_with()[0]
    problem = open_bind_problem(hosts, table, insecure)
    assert (problem is not None) is refused
    if problem:
        assert "--insecure" in problem
        assert hosts[0] in problem
