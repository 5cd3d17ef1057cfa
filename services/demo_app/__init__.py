"""``ds-demo-app``: the sample application of the compose stack (deploy/docker-compose.yml).

It does what an application beside a sidecar does — binds its group through the assigner,
fetches, acks — and keeps a log of every record it received and whether its ack was
accepted, so the compose tests can count produced against received records through faults
(``GET /received``).

With ``DS_TLS__*`` set (the compose stack's default) it reaches the mesh with mTLS and its
tokens, and serves its own HTTP port with TLS (and mTLS with ``DS_TLS__CLIENT_AUTH=require``).
"""
