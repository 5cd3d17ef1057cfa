"""Hypothesis strategies for pod templates as users write them: opt-in/opt-out annotations
and labels, groups, application and init containers with their own env, a sidecar injected
before (or by hand), a grace period or none."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from services.injector.patch import APP_ENV_NAMES, GROUP, INJECT, SIDECAR_NAME

names = st.text("abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=12)
flag_values = st.sampled_from(["true", "false", "TRUE", "False", "maybe", None])
groups = st.one_of(st.none(), names)


@st.composite
def metadata(draw: st.DrawFn) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    for section in ("annotations", "labels"):
        values: dict[str, str] = {}
        flag = draw(flag_values)
        if flag is not None:
            values[INJECT] = flag
        group = draw(groups)
        if group is not None:
            values[GROUP] = group
        if draw(st.booleans()):
            values["app.kubernetes.io/name"] = draw(names)
        if bool(values) or draw(st.booleans()):
            meta[section] = values
    return meta


@st.composite
def env_lists(draw: st.DrawFn) -> list[dict[str, Any]]:
    chosen = draw(
        st.lists(st.sampled_from([*APP_ENV_NAMES, "APP_MODE", "DS_OTHER", "HOST"]), unique=True)
    )
    return [{"name": name, "value": draw(names)} for name in chosen]


@st.composite
def containers(draw: st.DrawFn, prefix: str) -> dict[str, Any]:
    container: dict[str, Any] = {"name": f"{prefix}-{draw(names)}", "image": "app:1"}
    if draw(st.booleans()):
        container["env"] = draw(env_lists())
    return container


@st.composite
def pod_templates(draw: st.DrawFn) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": draw(st.lists(containers("c"), min_size=1, max_size=3, unique_by=_name))
    }
    init = draw(st.lists(containers("i"), max_size=2, unique_by=_name))
    if draw(st.booleans()):  # injected before, with another template or by hand
        old = {"name": SIDECAR_NAME, "image": "dataservice-mesh:0.0.1"}
        init.insert(draw(st.integers(0, len(init))), old)
    if init:
        spec["initContainers"] = init
    if draw(st.booleans()):
        spec["terminationGracePeriodSeconds"] = draw(st.integers(0, 600))
    return {"metadata": draw(metadata()), "spec": spec}


def _name(container: dict[str, Any]) -> str:
    return str(container["name"])
