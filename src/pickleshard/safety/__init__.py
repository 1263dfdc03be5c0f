"""What a pickle may do: :mod:`.policy` (restricted unpickling), :mod:`.allowlist` (the globals
allowed by default, presets), :mod:`.guards` (guarded stand-ins), :mod:`.bounds` (per-sample size
and depth), :mod:`.inert` (evaluation without running code) and :mod:`.audit` (every global a
file names, read from its opcodes).
"""

from .policy import DEFAULT_POLICY, UnpicklePolicy

__all__ = ["DEFAULT_POLICY", "UnpicklePolicy"]
