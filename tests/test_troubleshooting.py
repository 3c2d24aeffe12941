"""docs/troubleshooting.md states the code: each message it lists is the code's own text."""

from __future__ import annotations

import re

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.unit


def test_every_message_on_the_troubleshooting_page_is_the_codes_own_text():
    page = (REPO / "docs" / "troubleshooting.md").read_text()
    messages = re.findall(r"^\| `([^`]+)` \|", page, flags=re.MULTILINE)
    assert len(messages) >= 10, messages
    source = "\n".join(path.read_text() for path in (REPO / "scaling").rglob("*.py"))
    # a message the code builds over several string literals reads here as one text
    source = re.sub(r'"\s*\n\s*f?"', "", source)
    missing = [m for m in messages if m not in source]
    assert not missing, f"docs/troubleshooting.md quotes messages the code does not say: {missing}"
