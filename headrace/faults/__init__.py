"""Jepsen-style fault injection against headrace: histories, checkers, workloads, nemeses.

The top layer: it may import anything in headrace; nothing in headrace imports it.
"""
