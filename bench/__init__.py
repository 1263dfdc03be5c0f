"""Benchmarks for pickleshard: ``python -m bench`` (or ``pickleshard bench``) from a checkout.

Every row of a benchmark runs in a fresh Python process (see :mod:`bench.runner`) through the
same DataLoader loop (:mod:`bench.epoch`), so rows don't inherit each other's heap, and the
figures are compared as ratios measured on one machine in one run.
"""
