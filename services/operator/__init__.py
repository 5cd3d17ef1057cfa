"""``ds-operator``: reconciles DsGroup resources (deploy/k8s/base/crds/dsgroup.yaml) through
the assigner's admin API, one leader at a time (a coordination.k8s.io Lease)."""
