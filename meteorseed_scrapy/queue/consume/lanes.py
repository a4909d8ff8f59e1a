"""Lane weights: how a worker shares its free capacity between the realtime, scheduled and
retry lanes (``METEORSEED_LANE_WEIGHTS``), and the per-worker state that keeps the shares right
over time even when each read takes only one or two tasks."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from meteorseed_scrapy.settings import DEFAULTS, setting
from meteorseed_scrapy.task.lanes import LANES
from meteorseed_scrapy.validators import ConfigError

if TYPE_CHECKING:
    from meteorseed_scrapy.settings import SettingsSource

SETTING = "METEORSEED_LANE_WEIGHTS"
DEFAULT_WEIGHTS: str = DEFAULTS[SETTING]


@dataclass(frozen=True)
class LaneWeights:
    """A non-negative integer weight per lane (in :data:`LANES` order), at least one positive."""

    weights: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.weights) != len(LANES):
            raise ValueError(f"{SETTING}: expected {len(LANES)} weights, got {self.weights!r}")
        if any(w < 0 for w in self.weights) or not any(self.weights):
            raise ValueError(f"{SETTING}: weights must be >= 0 and not all 0")

    @classmethod
    def parse(cls, text: str) -> LaneWeights:
        """``"realtime:6,scheduled:3,retry:1"``: every lane once, integer weights."""
        found: dict[str, int] = {}
        for part in str(text).split(","):
            name, sep, raw = part.partition(":")
            name = name.strip()
            if not sep or name not in LANES:
                raise ValueError(
                    f"{SETTING}: {part.strip()!r} is not <lane>:<weight> with a lane of "
                    f"{', '.join(LANES)}"
                )
            if name in found:
                raise ValueError(f"{SETTING}: lane {name!r} given twice")
            try:
                found[name] = int(raw.strip())
            except ValueError:
                raise ValueError(f"{SETTING}: weight of {name!r} is not an integer: {raw!r}"
                                 ) from None
        missing = [lane for lane in LANES if lane not in found]
        if missing:
            raise ValueError(f"{SETTING}: no weight for lane {missing[0]!r}")
        return cls(tuple(found[lane] for lane in LANES))

    @classmethod
    def from_settings(cls, settings: SettingsSource) -> LaneWeights:
        raw = setting(settings, SETTING)
        if isinstance(raw, Mapping):  # a dict in settings.py reads naturally too
            raw = ",".join(f"{k}:{v}" for k, v in raw.items())
        try:
            return cls.parse(raw)
        except ValueError as exc:
            raise ConfigError(SETTING, str(exc).removeprefix(f"{SETTING}: ")) from None

    def __str__(self) -> str:
        return ",".join(f"{lane}:{w}" for lane, w in zip(LANES, self.weights, strict=True))


class LaneShares:
    """Smooth weighted round robin (as nginx balances upstreams) over read slots.

    Each slot goes to the lane with the highest running credit; the credits make the shares
    exact over consecutive reads, so a worker reading one task at a time still gives every
    lane its weight, and realtime wins ties. A lane that turns out to be empty simply loses
    its turn: the read gives its slots to the others and no debt builds up.
    """

    def __init__(self, weights: LaneWeights) -> None:
        self.weights = weights.weights
        self.total = sum(self.weights)
        self.credit = [0] * len(self.weights)

    def split(self, count: int) -> list[int]:
        """How many of ``count`` slots each lane gets, in :data:`LANES` order."""
        quotas = [0] * len(self.weights)
        for _ in range(max(0, count)):
            best = 0
            for i, w in enumerate(self.weights):
                self.credit[i] += w
                if self.credit[i] > self.credit[best]:
                    best = i
            self.credit[best] -= self.total
            quotas[best] += 1
        return quotas
