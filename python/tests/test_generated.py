"""The sync files generated from their asyncio source (``make python-generate``,
tools/generate_sync.py) are what the generator makes of that source now: an edit of the
asyncio source not regenerated, or an edit of a generated file, fails here."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

TOOL = Path(__file__).resolve().parent.parent / "tools" / "generate_sync.py"


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("generate_sync", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_files_are_fresh() -> None:
    diffs = _tool().stale()
    assert not diffs, "stale generated files (run `make python-generate`):\n" + "".join(diffs)


def test_a_changed_source_makes_its_twin_stale(tmp_path: Path) -> None:
    """The check can fail: the generator's output follows its source (one await-only line
    changed there changes the twin), and each twin says where it comes from."""
    tool = _tool()
    for name, source in tool.SOURCES.items():
        twin = (tool.PACKAGE / name).read_text(encoding="utf-8")
        assert twin.startswith(tool.HEADER.format(source=source))
        assert "await " not in twin and "async def" not in twin
    src = tmp_path / "redis_rlock"
    (src / "aio").mkdir(parents=True)
    name = "_drivers.py"
    text = (tool.PACKAGE / tool.SOURCES[name]).read_text(encoding="utf-8")
    marker = "        return await self._call_at(key, args, extra, at, asking, wait)\n"
    assert marker in text
    (src / tool.SOURCES[name]).write_text(text.replace(marker, marker + "        # changed\n", 1))
    for other, source in tool.SOURCES.items():
        (src / other).write_text((tool.PACKAGE / other).read_text(encoding="utf-8"))
        if other != name:
            (src / source).write_text((tool.PACKAGE / source).read_text(encoding="utf-8"))
    tool.PACKAGE = src
    assert "# changed" in tool.generate(name)
    assert len(tool.stale()) == 1
