"""align.utils.numerics: the host fingerprint every manifest carries reads /proc/cpuinfo once per process."""

from __future__ import annotations

import builtins

from align.utils import numerics


def test_cpu_model_is_read_once_per_process(monkeypatch):
    opened = []

    def counting_open(path, *args, **kwargs):
        opened.append(path)
        return builtins.open(path, *args, **kwargs)

    numerics.cpu_model.cache_clear()
    monkeypatch.setattr(numerics, "open", counting_open, raising=False)
    try:
        first = [numerics.fingerprint()["cpu"] for _ in range(3)]
        assert opened.count("/proc/cpuinfo") <= 1  # 0 where the host has no /proc/cpuinfo
        assert len(set(first)) == 1 and first[0]
    finally:
        numerics.cpu_model.cache_clear()
    monkeypatch.undo()
    assert numerics.cpu_model() == first[0]  # the cached value is what a fresh read finds
