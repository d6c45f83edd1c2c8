"""align.registry: named factories; an unknown name is a ConfigError listing the registered ones."""

import pytest

from align.exceptions import ConfigError
from align.registry import Registry


def test_register_get_and_unknown_names():
    reg = Registry("scheduler")

    @reg.register("cosine")
    def cosine(steps):
        return ("cosine", steps)

    reg.register("linear")(lambda steps: ("linear", steps))
    assert reg.get("cosine")(3) == ("cosine", 3) and reg.names() == ["cosine", "linear"] and "linear" in reg
    assert reg.register("cosine")(cosine) is cosine  # re-registering the same factory is harmless
    with pytest.raises(ValueError, match="already registered"):
        reg.register("cosine")(lambda steps: None)
    with pytest.raises(ConfigError, match="unknown scheduler 'cosin'; registered: cosine, linear"):
        reg.get("cosin")
