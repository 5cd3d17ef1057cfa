"""Status shows the effective librdkafka configuration to any reader of the group: no
credential of the sidecar's Kafka connection is in it (issue 37, finding 12).

Every ``sasl.*`` value is masked (``sasl.oauthbearer.config`` and ``.extensions`` carry
client secrets, ``sasl.username`` and ``sasl.kerberos.*`` name the principal), as are
keys, key passwords and secrets under any name; the rest is shown as it runs.
"""

from __future__ import annotations

from services.consumer_sidecar.kafka_config import shown_config

RUNNING = {
    "bootstrap.servers": "kafka:9093",
    "security.protocol": "SASL_SSL",
    "sasl.mechanism": "OAUTHBEARER",
    "sasl.username": "ds-sidecar",
    "sasl.password": "hunter2",
    "sasl.oauthbearer.config": "principal=ds clientSecret=s3cr3t",
    "sasl.oauthbearer.extensions": "logicalCluster=lkc-1,apiKey=AKIA",
    "sasl.oauthbearer.client.secret": "s3cr3t",
    "sasl.kerberos.keytab": "/etc/keytab",
    "sasl.jaas.config": "org.apache.kafka... password=hunter2",
    "ssl.key.password": "pw",
    "ssl.key.pem": "-----BEGIN PRIVATE KEY-----",
    "ssl.keystore.password": "pw",
    "ssl.ca.location": "/etc/ca.pem",
    "fetch.max.bytes": 1048576,
    "stats_cb": print,
}


def test_status_masks_every_sasl_value_and_every_secret() -> None:
    shown = shown_config(RUNNING)
    print({k: v for k, v in shown.items() if k.startswith(("sasl.", "ssl."))})
    for key, value in RUNNING.items():
        if key == "stats_cb":
            assert key not in shown
        elif (key.startswith("sasl.") and key != "sasl.mechanism") or "password" in key:
            assert shown[key] == "***", key
        elif key == "ssl.key.pem":
            assert shown[key] == "***"
        else:
            assert shown[key] == str(value), key
    leaked = [v for v in shown.values() if "s3cr3t" in v or "hunter2" in v or "AKIA" in v]
    assert leaked == []
