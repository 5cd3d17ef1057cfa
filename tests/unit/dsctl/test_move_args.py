"""``dsctl move``'s PARTITION argument is checked before anything is called."""

from __future__ import annotations

import pytest

from services.dsctl.admin_client import CliError
from services.dsctl.operate import move


@pytest.mark.parametrize("partition", ["orders", ":3", "orders:x", "orders:\u00b9", "orders:-1"])
def test_a_bad_partition_is_a_cli_error_naming_the_form(partition: str) -> None:
    # "¹" passes str.isdigit() and not int(): it must not end in a traceback.
    with pytest.raises(CliError, match="expected TOPIC:PARTITION"):
        move("g", partition, "sidecar-1", assigner="127.0.0.1:1", timeout=0.1)
