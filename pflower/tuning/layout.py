"""Where a tuning suite's results live, ``<root>/<setting>/...``: the study storage, each
trial's and final run's folder, the chosen values, profiles, refusals and the locks
([`pflower.tuning.search`][pflower.tuning.search] and the leaderboard read and write them)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pflower.searchspace import format_value


@dataclass(frozen=True)
class Layout:
    """Where a suite's results live: ``<root>/<setting>/...``."""

    root: Path

    def setting_dir(self, setting: str) -> Path:
        return self.root / setting

    def storage_url(self, setting: str) -> str:
        return f"sqlite:///{(self.setting_dir(setting) / 'study.db').resolve()}"

    def trial_dir(self, setting: str, method: str, number: int, study: int | None = None) -> Path:
        return in_study(self.setting_dir(setting) / "trials" / method, study) / f"{number:03d}"

    def chosen_file(self, setting: str, method: str, study: int | None = None) -> Path:
        """``chosen/<method>.yaml`` (a suite of one study), ``chosen/<method>/study_<k>.yaml``."""
        chosen = self.setting_dir(setting) / "chosen"
        return (
            chosen / f"{method}.yaml" if study is None else chosen / method / f"study_{study}.yaml"
        )

    def final_dir(self, setting: str, method: str, seed: int, study: int | None = None) -> Path:
        return in_study(self.setting_dir(setting) / "final" / method, study) / f"seed_{seed}"

    def profiles_dir(self, setting: str, method: str, study: int | None = None) -> Path:
        """The profiles at the values ``method``'s study chose
        ([`.profile`][pflower.tuning.profile])."""
        return in_study(self.setting_dir(setting) / "profiles" / method, study)

    def profile_file(self, setting: str, method: str, key: str, study: int | None = None) -> Path:
        """The profile of ``key`` at the values ``method``'s study chose."""
        return self.profiles_dir(setting, method, study) / f"{key}.yaml"

    def profile_runs_dir(
        self, setting: str, method: str, key: str, study: int | None = None
    ) -> Path:
        """The runs of ``key``'s profile, one folder per value."""
        return self.profiles_dir(setting, method, study) / key

    def profile_run_dir(
        self, setting: str, method: str, key: str, value: Any, study: int | None = None
    ) -> Path:
        return self.profile_runs_dir(setting, method, key, study) / format_value(value)

    def refusal_file(self, setting: str, method: str) -> Path:
        """Why the setting's configuration refuses ``method`` (written instead of tuning it)."""
        return self.setting_dir(setting) / "refused" / f"{method}.txt"

    def lock_file(self, setting: str) -> Path:
        return self.setting_dir(setting) / ".study.lock"

    def drivers_file(self, setting: str) -> Path:
        """Held shared by every ``pflower tune`` running trials of the setting (`driving`)."""
        return self.setting_dir(setting) / ".drivers.lock"


def in_study(folder: Path, study: int | None) -> Path:
    """``folder`` itself for a suite of one study, else its ``study_<k>`` subfolder."""
    return folder if study is None else folder / f"study_{study}"
