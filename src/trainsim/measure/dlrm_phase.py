"""A measured DLRM iteration normalised to the machine's fast speed phase (the method of measure.phase and
measure.stage_db.phase_normalised_s, applied to measure.dlrm's iterations).

Each rank times its probes (measure.dlrm_probe) just before the barrier that opens an iteration and just after
the iteration's last step, in the thread's CPU time. An iteration's reference is the slowest rank's mean of its
two probes (the iteration's time is the slowest rank's, as in measure.dlrm); its normalised time is its time x
(fast-phase reference / its reference), the fast-phase reference being a low quantile of the references of a
whole campaign (measure.phase.fast_reference_s), so that every run of the campaign is scaled to the same
speed. Torch-free: the parent process and the campaign scripts read it.
"""

from collections.abc import Sequence

from trainsim.errors import ConfigError
from trainsim.measure.phase import fast_reference_s, phase_normalised_s, phase_scaled_s, slowest_rank_references_s

PROBES = ("reference", "gather")  # measure.dlrm_probe's probes: measure.phase's mix, an EmbeddingBag step

# per rank, per iteration: (probe before, probe after) in thread CPU seconds
RankProbes = Sequence[Sequence[Sequence[float]]]


def check_probes(names: Sequence[str]) -> tuple[str, ...]:
    """The probe names, checked against PROBES."""
    for name in names:
        if name not in PROBES:
            raise ConfigError("probe", name, f"one of {', '.join(PROBES)}")
    return tuple(names)


def iteration_references_s(rank_probes: RankProbes) -> list[float]:
    """Per iteration, the slowest rank's mean of its probe before and its probe after."""
    if not rank_probes or len({len(rank) for rank in rank_probes}) != 1:
        raise ValueError(f"probe timings of {[len(rank) for rank in rank_probes]} iterations per rank: need "
                         "one pair per iteration on every rank")
    return slowest_rank_references_s(rank_probes)


def normalised_iterations_s(iterations_s: Sequence[float], references_s: Sequence[float],
                            fast_s: float) -> list[float]:
    """Each iteration as it would have taken in the fast phase: time x fast_s / its reference
    (measure.phase.phase_scaled_s)."""
    return phase_scaled_s(iterations_s, references_s, fast_s)


def phase_normalised_iteration_s(iterations_s: Sequence[float], references_s: Sequence[float],
                                 fast_s: float) -> float:
    """The median of the normalised iterations (a config's phase-normalised iteration time)."""
    return phase_normalised_s(iterations_s, references_s, fast_s)


def campaign_fast_reference_s(references_s: Sequence[Sequence[float]]) -> float:
    """The fast-phase reference of a campaign: the low quantile over every iteration's reference of every run."""
    return fast_reference_s([r for run in references_s for r in run])
