"""The resume checker now ships in the kit as :mod:`pickleshard.testing.resume`; tests that still
import ``resume_checker`` get the same names from there."""

from pickleshard.testing.resume import (
    StatefulSampler,
    check_loader_resume,
    check_rescaled_resume,
    check_resume,
    loader_ids,
    write_id_files,
)

__all__ = [
    "StatefulSampler",
    "check_loader_resume",
    "check_rescaled_resume",
    "check_resume",
    "loader_ids",
    "write_id_files",
]
