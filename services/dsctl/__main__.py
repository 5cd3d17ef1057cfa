"""``dsctl`` entry point."""

from __future__ import annotations

from services.dsctl.app import app


def main() -> None:
    app()


if __name__ == "__main__":
    main()
