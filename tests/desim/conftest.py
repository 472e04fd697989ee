"""Fixtures of the desim tests: the toy plug-ins and a small toy study folder."""

from __future__ import annotations

from pathlib import Path

import pytest
from _toy import write_study  # importing _toy registers the toy protocol and curve


@pytest.fixture
def toy_study(tmp_path: Path) -> Path:
    """A fresh folder holding the toy study."""
    return write_study(tmp_path / "toy")
