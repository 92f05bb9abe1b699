"""The base of every named config block: a dataclass whose ``name`` picks the factory."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from pflower.config import (
    require,
)


@dataclass
class Block:
    """A named block: ``name`` picks the factory (set by ``<group>=<name>``)."""

    config_name: ClassVar[str] = ""
    name: str = ""

    def __post_init__(self) -> None:
        require(
            self.name == self.config_name,
            f"{self.group()}.name is {self.name!r} but the keys are those of "
            f"{self.config_name!r}: choose with {self.group()}=<name>, not {self.group()}.name",
        )

    @classmethod
    def group(cls) -> str:
        return "block"
