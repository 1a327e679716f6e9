"""The calibration profile file: fitted constants and error-band residuals, as YAML.

Format (``shardplan_calibration: 1``; written by ``bench/calibrate_defaults.py`` for the
shipped ``defaults.yaml`` and by ``shardplan calibrate`` for a user's runs)::

    shardplan_calibration: 1
    runtime: megatron            # the profile the constants were fitted for (null: all)
    constants: {matmul_efficiency.hopper: 0.71, ...}   # names and bounds: constants.py
    bands: {step_time: {pooled: {n, mu, sigma, ...}, labels: {...}}, memory: {...}}
    fit: {runs: 120, ...}        # provenance and the fit's own report (free-form numbers)

Every value is validated (unknown keys and out-of-range constants are refused with the name of
the key), like every other input of the planner.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

import yaml

from planner.calibration.bands import BandTable
from planner.calibration.constants import DEFAULTS_FILE, FORMAT_KEY, Constants, validate_values
from planner.errors import invalid

KEYS = (FORMAT_KEY, "runtime", "description", "constants", "bands", "fit")


@dataclass(frozen=True)
class CalibrationProfile:
    constants: Constants
    bands: BandTable | None
    runtime: str | None = None
    description: str = ""
    fit: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def to_plain(self) -> dict:
        return {FORMAT_KEY: 1, "runtime": self.runtime, "description": self.description,
                "constants": {k: round(float(v), 5) for k, v in sorted(self.constants.values.items())},
                "bands": self.bands.to_plain() if self.bands else None,
                "fit": dict(self.fit)}


def dump(profile: CalibrationProfile) -> str:
    return yaml.safe_dump(profile.to_plain(), sort_keys=False, width=100)


def parse(data: Any, where: str) -> CalibrationProfile:
    if not isinstance(data, Mapping):
        raise invalid(f"{where}: expected a mapping (a calibration profile)")
    unknown = sorted(set(data) - set(KEYS))
    if unknown:
        raise invalid(f"{where}: unknown key(s) {', '.join(map(str, unknown))}",
                      f"valid keys: {', '.join(KEYS)}")
    if data.get(FORMAT_KEY) != 1:
        raise invalid(f"{where}: {FORMAT_KEY}: expected 1, got {data.get(FORMAT_KEY)!r}")
    runtime = data.get("runtime")
    if runtime is not None:
        from planner.profiles import profile
        runtime = profile(str(runtime)).name
    values = validate_values(data.get("constants") or {}, where)
    bands = None
    if data.get("bands"):
        try:
            bands = BandTable.from_plain(data["bands"])
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise invalid(f"{where}: bands: malformed ({exc})") from None
    fit = data.get("fit") or {}
    if not isinstance(fit, Mapping):
        raise invalid(f"{where}: fit: expected a mapping")
    return CalibrationProfile(Constants(MappingProxyType(values), where), bands, runtime,
                              str(data.get("description") or ""), MappingProxyType(dict(fit)))


def _identity(profile: CalibrationProfile) -> dict:
    """What a profile predicts with, exactly: its runtime, constants and error bands (not its
    description or fit report)."""
    return {"runtime": profile.runtime,
            "constants": {k: float(v) for k, v in sorted(profile.constants.values.items())},
            "bands": profile.bands.to_plain(exact=True) if profile.bands else None}


def profile_hash(profile: CalibrationProfile) -> str:
    """``sha256:`` + the SHA-256 of the canonical JSON of :func:`_identity`: two files that
    predict the same (other comments, description or fit report) have the same hash."""
    text = json.dumps(_identity(profile), sort_keys=True, separators=(",", ":"),
                      allow_nan=False)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def profile_record(profile: CalibrationProfile, spec: str) -> dict:
    """A plan's ``inputs.calibration``: the profile given as ``spec`` (``plan --calibration``),
    its hash and what it predicts with, so that ``check`` needs no file to reproduce the
    plan's runtime options and error bands."""
    return {"spec": str(spec), "sha256": profile_hash(profile), **_identity(profile)}


def profile_from_record(record: Mapping, where: str) -> CalibrationProfile:
    """The profile of a plan's ``inputs.calibration``, validated as a profile file is
    (INVALID_INPUT naming ``where`` otherwise)."""
    try:
        data = {FORMAT_KEY: 1, "runtime": record["runtime"], "constants": record["constants"],
                "bands": record["bands"]}
    except (KeyError, TypeError):
        raise invalid(f"{where}: expected runtime, constants and bands") from None
    return parse(data, where)


def load(path: str | Path) -> CalibrationProfile:
    from planner.safe_input import parse_yaml, read_text
    text = read_text(Path(path), "calibration profile")
    return parse(parse_yaml(text, str(path)) if text.strip() else None, str(path))


@lru_cache(maxsize=1)
def shipped() -> CalibrationProfile | None:
    """The library's calibrated defaults (None before bench/calibrate_defaults.py ran)."""
    if not DEFAULTS_FILE.is_file():
        return None
    # libyaml's parser where PyYAML has it, with the safe loader's constructor and resolver:
    # the same data as yaml.safe_load, ten times faster (every process reads this file once).
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return parse(yaml.load(DEFAULTS_FILE.read_text(), Loader=loader),  # noqa: S506 - safe
                 "planner/calibration/defaults.yaml")
