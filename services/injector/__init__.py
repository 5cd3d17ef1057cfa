"""Sidecar injection: the one patch (``patch.py``, pure) that ``dsctl inject`` applies to
manifests and the mutating admission webhook (``server.py``, ``ds-injector``) applies to pods."""
