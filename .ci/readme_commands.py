"""Prints the README's set-up commands (`setup`) or its test command (`test`), one per line, as the README shows
them: CI runs exactly what a newcomer pastes."""

import re
import sys
from pathlib import Path

readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
section = readme.split("## Set up", 1)[1].split("\n## ", 1)[0]
blocks = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
if len(blocks) != 2:
    sys.exit(f"README's 'Set up' section must hold two bash blocks (set-up, tests), found {len(blocks)}")
which = {"setup": 0, "test": 1}[sys.argv[1]]
print(blocks[which].strip())
