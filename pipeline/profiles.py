"""Profiles: `doit profile=NAME ...` picks `configs/NAME/`; the default is `tiny`.

A profile exists when `configs/<name>/common.toml` exists; its tables (align.profile.CommonConfig) say how the
profile's stages are launched."""

from __future__ import annotations

from align.config import load_config
from align.profile import CommonConfig
from pipeline.layout import Layout, Project

DEFAULT_PROFILE = "tiny"


def known_profiles(project: Project) -> list[str]:
    base = project.root / "configs"
    if not base.is_dir():
        return []
    return sorted(p.name for p in base.iterdir() if (p / "common.toml").is_file())


def selected_profile() -> str:
    """The profile named on doit's command line (`doit profile=NAME`), else the default."""
    from doit import get_var

    return get_var("profile", DEFAULT_PROFILE) or DEFAULT_PROFILE


def check_profile(project: Project, profile: str) -> None:
    known = known_profiles(project)
    if profile not in known:
        raise ValueError(f"unknown profile {profile!r}: no {project.root / 'configs' / profile / 'common.toml'}; "
                         f"known profiles: {', '.join(known) or 'none'}")


def load_common(layout: Layout) -> CommonConfig:
    """The profile's shared tables; raises ConfigError naming the file and key."""
    return load_config(layout.common_config, CommonConfig)
