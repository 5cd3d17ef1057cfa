"""The assigner UI's unit tests' HTML helpers: parse a rendered page, find elements by attribute,
and the hostile string every field is rendered with."""

from __future__ import annotations

from html.parser import HTMLParser

EVIL = '<script>alert("x")</script>&'


class Elements(HTMLParser):
    """Every start tag with its attributes, and the text, of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def parse(html: str) -> Elements:
    parser = Elements()
    parser.feed(html)
    return parser


def with_attr(html: str, name: str) -> list[dict[str, str | None]]:
    return [attrs for _tag, attrs in parse(html).tags if name in attrs]
