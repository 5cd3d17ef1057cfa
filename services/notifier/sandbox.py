"""The Jinja2 sandbox alert templates render in, with an output-size limit (pure).

An immutable sandbox (``jinja2.sandbox``: no access to internals, no mutation, no file
system) whose repetition and power operators refuse results past the limit before they
are built (``{{ 'x' * 50000000 }}`` is refused, not allocated), and whose output is
streamed and cut off at the limit. Loops that produce nothing, and memory a filter may
allocate, are bounded by the render worker (``render_worker.py``: a time limit, a memory
limit) — no in-process check can stop them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

# Python refuses to print an int of more digits than this (sys.int_info); a larger power
# is refused before it is computed.
MAX_POWER_DIGITS = 4300


class OutputTooLarge(Exception):
    """The template's output (or a value it builds) is larger than the limit."""


class LimitedSandbox(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset({"*", "**"})

    def __init__(self, max_bytes: int) -> None:
        super().__init__(autoescape=False, undefined=jinja2.Undefined)
        self.max_bytes = max_bytes

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "*":
            self._check_repeat(left, right)
            self._check_repeat(right, left)
        elif operator == "**" and _too_many_digits(left, right):
            raise OutputTooLarge(f"{left} ** {right} has too many digits")
        return super().call_binop(context, operator, left, right)

    def _check_repeat(self, sequence: Any, times: Any) -> None:
        sized = isinstance(sequence, str | bytes | list | tuple) and _int(times)
        if sized and len(sequence) * max(times, 0) > self.max_bytes:
            raise OutputTooLarge(
                f"repeating {len(sequence)} items {times} times is over the output "
                f"limit of {self.max_bytes} bytes"
            )


def _too_many_digits(left: Any, right: Any) -> bool:
    """Whether ``left ** right`` (ints) has more digits than Python prints: about
    ``right * digits(left)``."""
    if not (_int(left) and _int(right)) or abs(left) <= 1 or right <= 0:
        return False
    return bool(right * len(str(abs(left))) > MAX_POWER_DIGITS)


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def render_limited(env: LimitedSandbox, text: str, variables: Mapping[str, Any]) -> str:
    """Render ``text``; :class:`OutputTooLarge` once the output passes ``env.max_bytes``
    (UTF-8). Other errors are the template's (sandbox violations, bad filter calls)."""
    out: list[str] = []
    size = 0
    for chunk in env.from_string(text).generate(dict(variables)):
        size += len(chunk.encode())
        if size > env.max_bytes:
            raise OutputTooLarge(f"the output is over the limit of {env.max_bytes} bytes")
        out.append(chunk)
    return "".join(out)
