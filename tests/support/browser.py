"""A headless Chromium for the UI e2e tests: dump a page's DOM, take a screenshot."""

from __future__ import annotations

import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


class Dom(HTMLParser):
    """Start tags with their attributes, from Chromium's rendered DOM."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str]]] = []
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, {k: v or "" for k, v in attrs}))

    def having(self, attr: str) -> list[dict[str, str]]:
        return [a for _, a in self.tags if attr in a]


def chromium(profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Headless Chromium with a fresh profile; ``args`` end with the URL."""
    argv = [
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
        "--no-first-run", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--hide-scrollbars", f"--user-data-dir={profile}", *args,
    ]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=True)


def dump_dom(log_dir: Path, url: str, name: str) -> Dom:
    result = chromium(log_dir / f"chromium-{name}-dom", "--dump-dom", url)
    (log_dir / f"{name}.dom.html").write_text(result.stdout)
    assert "<html" in result.stdout, result.stderr[-2000:]
    return Dom(result.stdout)


def screenshot(log_dir: Path, url: str, name: str) -> Path:
    path = log_dir / f"ui-screenshot-{name}.png"
    chromium(
        log_dir / f"chromium-{name}-shot", f"--screenshot={path}", "--window-size=1280,1600", url
    )
    assert path.stat().st_size > 10_000, "screenshot missing or blank"
    shutil.copy(path, f"/tmp/ui-screenshot-{name}.png")
    return path
