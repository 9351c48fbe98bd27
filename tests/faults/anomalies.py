"""Assertions shared by the checker tests."""

from __future__ import annotations


def only(result, kind: str):
    """The result holds exactly one anomaly, of ``kind``; returns it."""
    counts = result.counts()
    assert counts[kind] == 1, result.anomalies
    assert sum(counts.values()) == 1, result.anomalies
    return result.anomalies[kind][0]
