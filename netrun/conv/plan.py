"""The plan a conv op holds: its problem for the current shapes and an algorithm per direction."""
from __future__ import annotations

from dataclasses import dataclass, field

from netrun.conv.algorithm import ConvAlgorithm
from netrun.conv.problem import ConvProblem

SHORT = {"forward": "fwd", "backward_data": "data", "backward_filter": "filter"}


@dataclass
class ConvPlan:
    """What one conv op decided for one set of input shapes (redone when they change).

    `key` is what the plan was made for (input shapes, dtype, the settings' generation);
    `algos` fills in per direction on first use; `scratch_bytes` is the most scratch the
    chosen algorithms ask for; `warmed` says whether the workspace warmed them up at bind.
    """

    key: tuple
    problem: ConvProblem
    out_shape: tuple[int, ...]
    algos: dict[str, ConvAlgorithm] = field(default_factory=dict)
    warmed: bool = False
    # how the op holds its arrays when they are channel-blocked (a oneDNN conv Layout that
    # the algorithm is handed); None: in the op's order
    layout: object = None

    @property
    def scratch_bytes(self) -> int:
        """Scratch of the most demanding algorithm chosen so far."""
        return max((a.workspace_bytes(self.problem) for a in self.algos.values()), default=0)

    @property
    def label(self) -> str:
        """The chosen algorithms for profiles: one name, or 'fwd:x/filter:y' when they differ."""
        names = list(dict.fromkeys(a.name for a in self.algos.values()))
        if len(names) <= 1:
            return names[0] if names else ""
        return "/".join(f"{SHORT[d]}:{a.name}" for d, a in self.algos.items())
