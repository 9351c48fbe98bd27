"""Group coordinator and offset store as pure state machines (no sockets, no storage).

Entry point: ``GroupCoordinator`` (``coordinator``); requests, responses and effects in
``messages``; ``__consumer_offsets`` record formats in ``records``.
"""
