"""What tests read from README.md: the examples it gives, checked against what runs."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_toml(starting: str) -> str:
    """The README's ```toml block that starts with `starting`."""
    blocks = re.findall(r"```toml\n(.*?)```", README.read_text(), re.DOTALL)
    (block,) = [b for b in blocks if b.startswith(starting)]
    return block


def readme_sql(starting: str) -> str:
    """The README's ```sql block that starts with `starting`."""
    blocks = re.findall(r"```sql\n(.*?)```", README.read_text(), re.DOTALL)
    (block,) = [b for b in blocks if b.startswith(starting)]
    return block


def readme_python(starting: str) -> str:
    """The README's ```python block that starts with `starting`."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.DOTALL)
    (block,) = [b for b in blocks if b.startswith(starting)]
    return block
