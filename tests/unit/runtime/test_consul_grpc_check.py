"""The Consul gRPC health check a service registers (pure: the check's definition; Consul
running it: tests/integration/test_discovery.py, tests/e2e/test_dev_secure_consul.py)."""

from __future__ import annotations

from services.runtime.discovery import ServiceInstance, grpc_check


def test_a_tls_port_is_checked_over_tls_naming_the_address_it_dials() -> None:
    instance = ServiceInstance("ds-sidecar", "ds-sidecar-1", "127.0.0.1", 7080, tls=True)
    check = grpc_check(instance, "1s")
    assert check["grpc"] == "127.0.0.1:7080"
    assert check["grpc_use_tls"] is True
    assert check["tls_skip_verify"] is True
    # Not the Consul node's name, which an agent with TLS for checks sends otherwise.
    assert check["TLSServerName"] == "127.0.0.1"


def test_a_plaintext_port_is_checked_in_plaintext() -> None:
    instance = ServiceInstance("ds-sidecar", "ds-sidecar-1", "10.0.0.7", 7080)
    check = grpc_check(instance, "1s")
    assert check["grpc"] == "10.0.0.7:7080"
    assert not {"grpc_use_tls", "tls_skip_verify", "TLSServerName"} & check.keys()
