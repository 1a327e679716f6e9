"""What ``shardplan check`` reports: the problems found, each stage's memory against capacity,
the remedies tried, and the verdict (the report types of :mod:`planner.check`).

Pure values with a ``to_dict`` each; the CLI renders them and maps ``ok`` to the exit code.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from planner.cost.terms import MemoryBreakdown
from planner.errors import ExitCode
from planner.hardware import GIB

REPORT_KIND = "shardplan-check"


@dataclass(frozen=True)
class Problem:
    """One reason the check fails. ``code``: inputs, integrity, stale, degrees, placement,
    stages, micro_batches, layers, config, memory, runtime (``check --runtime``: something the
    runtime cannot run)."""

    code: str
    message: str

    def to_dict(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


@dataclass(frozen=True)
class InputCheck:
    """Where the model (or cluster) came from and whether it is the one the plan was made for."""

    role: str  # "model" or "cluster"
    source: str  # "embedded" or the spec given on the command line
    name: str
    sha256: str
    plan_sha256: str

    @property
    def stale(self) -> bool:
        return self.sha256 != self.plan_sha256

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "name": self.name, "sha256": self.sha256,
                "plan_sha256": self.plan_sha256, "stale": self.stale}


@dataclass(frozen=True)
class StageCheck:
    index: int
    needed: MemoryBreakdown  # bytes per GPU, current cost model
    capacity_bytes: float
    planned_total_gib: float | None  # what the plan file recorded for this stage

    @property
    def fits(self) -> bool:
        return self.needed.total <= self.capacity_bytes

    @property
    def over_gib(self) -> float:
        return (self.needed.total - self.capacity_bytes) / GIB

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "needed_gib": self.needed.gib(),
                "capacity_gib": self.capacity_bytes / GIB, "fits": self.fits,
                "headroom_gib": -self.over_gib, "planned_total_gib": self.planned_total_gib}


@dataclass(frozen=True)
class Remedy:
    """A single change and what it does to the stages over capacity."""

    key: str  # machine-readable: "recompute=full@stage:2", "zero=3", "micro_batch=1", ...
    change: str  # for people
    saves_gib: tuple[tuple[int, float], ...]  # (stage, GiB saved) for each stage over capacity
    peak_gib: float  # peak per GPU after the change
    fits: bool  # every stage fits after the change

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "change": self.change,
                "saves_gib": [{"stage": s, "gib": g} for s, g in self.saves_gib],
                "peak_gib": self.peak_gib, "fits": self.fits}


@dataclass(frozen=True)
class CheckReport:
    plan_path: str | None
    inputs: tuple[InputCheck, ...]
    allow_stale: bool
    problems: tuple[Problem, ...]
    stages: tuple[StageCheck, ...]  # empty when the plan could not be evaluated
    remedies: tuple[Remedy, ...]
    capacity_gib: float
    parallelism: dict[str, Any] = field(default_factory=dict)
    # error-band verdict (planner/calibration/bands.py): "fits", "fits only at the optimistic
    # end" (the prediction fits, the band's pessimistic end does not) or "does not fit"
    memory_verdict: str | None = None
    memory_interval_gib: tuple[float, float] | None = None
    memory_confidence: float = 0.5  # the quantile of the memory band the gate uses
    memory_gate_gib: float | None = None  # predicted peak at that quantile
    runtime: str | None = None  # the runtime profile whose memory layout the check used

    @property
    def evaluated(self) -> bool:
        return bool(self.stages)

    @property
    def fits(self) -> bool | None:
        return all(s.fits for s in self.stages) if self.stages else None

    @property
    def stale(self) -> bool:
        return any(i.stale for i in self.inputs)

    @property
    def gate_passes(self) -> bool:
        return self.memory_gate_gib is None or self.memory_gate_gib <= self.capacity_gib

    @property
    def ok(self) -> bool:
        return not self.problems and self.fits is True and self.gate_passes

    @property
    def exit_code(self) -> ExitCode:
        return ExitCode.OK if self.ok else ExitCode.FAILED

    @property
    def peak_gib(self) -> float | None:
        return max(s.needed.total for s in self.stages) / GIB if self.stages else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": REPORT_KIND, "ok": self.ok, "fits": self.fits, "stale": self.stale,
            "allow_stale": self.allow_stale, "plan": self.plan_path,
            "exit_code": int(self.exit_code),
            "inputs": {i.role: i.to_dict() for i in self.inputs},
            "problems": [p.to_dict() for p in self.problems],
            "capacity_gib": self.capacity_gib, "peak_gib": self.peak_gib,
            "memory_verdict": self.memory_verdict,
            "memory_interval_gib": list(self.memory_interval_gib)
            if self.memory_interval_gib else None,
            "memory_confidence": self.memory_confidence,
            "memory_gate_gib": self.memory_gate_gib,
            "memory_margin_gib": (self.capacity_gib - self.memory_gate_gib
                                  if self.memory_gate_gib is not None else None),
            "parallelism": self.parallelism, "runtime": self.runtime,
            "stages": [s.to_dict() for s in self.stages],
            "remedies": [r.to_dict() for r in self.remedies],
        }
