"""The robustness study across sections: benign clients' accuracy against the share of malicious
clients, per attack, method (with its robust aggregator) and model type (FLAME paper, Zhu et al.,
Sec. VI-B3 and its Fig. 7).

Each attack and fraction is its own section of the report (they are configuration keys); this
module gathers them into lines. An attack-free run (``attack=none``, or any attack at fraction 0:
no client is then malicious,
[`pflower.robust.attacks.malicious_set`][pflower.robust.attacks.malicious_set]) is the same run for
every attack, so it gives each attack's line its point at fraction 0: a study runs it once.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from pflower.reporting.stats import LAST10, Cell, model_key, model_points
from pflower.reporting.tables import Section, format_cell, markdown_table


@dataclass(frozen=True)
class Line:
    """One line of the study: a method, its aggregator and a model type ('' for one model)."""

    method: str
    robust: str
    model: str

    @property
    def label(self) -> str:
        name = self.method if self.robust == "none" else f"{self.method} + {self.robust}"
        return f"{name} {self.model}".strip()


@dataclass(frozen=True)
class Point:
    """Benign clients' mean Acc(L) over seeds: at the final round and over the last 10%."""

    final: Cell
    last10: Cell | None


Panels = dict[tuple[str, str], dict[Line, dict[float, Point]]]
"""(attack, partition) -> line -> share of malicious clients -> point."""


def robustness_panels(sections: Sequence[Section], stage: str) -> Panels:
    """Every attacked experiment's points at ``stage``, with the attack-free runs' points at
    fraction 0 of every attack of the same partition, method, aggregator and model type. Panels
    with a single fraction on every line are dropped (nothing to draw a line through)."""
    panels: Panels = defaultdict(lambda: defaultdict(dict))
    attack_free: dict[tuple[str, Line], Point] = {}
    for section in sections:
        for experiment in section.experiments:
            attack = str(experiment.config.get("attack.name", "none"))
            fraction = float(experiment.config.get("attack.fraction", 0.0))
            robust = str(experiment.config.get("robust.name", "none"))
            cells = section.cells.get((experiment.method, experiment.partition), {})
            for model, accuracy, _ in model_points(cells, stage):
                line = Line(experiment.method, robust, model)
                point = Point(accuracy, cells.get(model_key(stage, model, "Acc(L)") + LAST10))
                if attack == "none" or fraction == 0.0:
                    attack_free[experiment.partition, line] = point
                else:
                    panels[attack, experiment.partition][line][fraction] = point
    for (_, partition), lines in panels.items():
        for line, points in lines.items():
            if (partition, line) in attack_free:
                points.setdefault(0.0, attack_free[partition, line])
    return {
        key: dict(lines)
        for key, lines in sorted(panels.items())
        if any(len(points) > 1 for points in lines.values())
    }


def robustness_table(panels: Panels) -> list[str]:
    """The study as one markdown table: a row per attack, partition and line, a column per share
    of malicious clients, cells ``final / last 10%`` as ``mean ± std (seeds)`` in %."""
    fractions = sorted({f for lines in panels.values() for p in lines.values() for f in p})
    header = ["attack", "partition", "method"] + [f"malicious {f:.0%}" for f in fractions]
    rows = []
    for (attack, partition), lines in panels.items():
        for line, points in lines.items():
            cells = []
            for fraction in fractions:
                point = points.get(fraction)
                cells.append(
                    "-"
                    if point is None
                    else f"{format_cell(point.final, 'percent')} / "
                    f"{format_cell(point.last10, 'percent')}"
                )
            rows.append([attack, partition, line.label, *cells])
    return markdown_table(header, rows)
