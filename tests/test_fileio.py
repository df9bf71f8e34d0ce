"""Files the tool writes are written atomically, with ordinary permissions."""

from __future__ import annotations


def test_atomic_write_keeps_permissions_and_leaves_nothing_behind(tmp_path) -> None:
    import os

    from costmodel.core.fileio import atomic_write_text

    fresh = atomic_write_text(tmp_path / "new.txt", "a")
    assert fresh.stat().st_mode & 0o777 == 0o666 & ~_umask()
    kept = tmp_path / "kept.txt"
    kept.write_text("old")
    os.chmod(kept, 0o640)
    atomic_write_text(kept, "new")
    assert kept.read_text() == "new" and kept.stat().st_mode & 0o777 == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.txt", "new.txt"]


def _umask() -> int:
    import os

    mask = os.umask(0)
    os.umask(mask)
    return mask
