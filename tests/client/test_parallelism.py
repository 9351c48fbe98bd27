"""The adaptive-parallelism policy: how many workers a handler's measured cost calls for."""

from headrace.client.parallelism import HandlerWindow, ParallelismLimits, target_workers

LIMITS = ParallelismLimits(max_workers=32, single_worker_max_run_us=100, cpu_share_max=0.8,
                           busy_fraction_to_grow=0.5)
WINDOW_NS = 50_000_000


def _window(runs, wall_ns_per_run, cpu_ns_per_run, active, blocked=False, window_ns=WINDOW_NS):
    return HandlerWindow(runs=runs, records=runs, handler_wall_ns=runs * wall_ns_per_run,
                         handler_cpu_ns=runs * cpu_ns_per_run, window_ns=window_ns,
                         active_workers=active, blocked=blocked)


def test_cheap_running_handler_goes_inline():
    assert target_workers(_window(1_000, 40_000, 40_000, active=32), LIMITS) == 0
    assert target_workers(_window(1_000, 40_000, 21_000, active=1), LIMITS) == 0
    assert target_workers(_window(1_000, 40_000, 40_000, active=0), LIMITS) == 0


def test_cheap_waiting_handler_shrinks_to_one_worker():
    assert target_workers(_window(1_000, 99_000, 1_000, active=4), LIMITS) == 1  # waits, but briefly
    assert target_workers(_window(1_000, 40_000, 19_000, active=0), LIMITS) == 1


def test_inline_not_allowed_keeps_one_worker():
    no_inline = ParallelismLimits(max_workers=32, inline_allowed=False)
    assert target_workers(_window(1_000, 40_000, 40_000, active=32), no_inline) == 1


def test_leaving_inline_mode_sizes_from_one_worker():
    ten_ms_sleep = _window(5, 10_000_000, 20_000, active=0)
    assert target_workers(ten_ms_sleep, LIMITS) == 32
    idle = _window(1, 1_000_000, 10_000, active=0)
    assert target_workers(idle, LIMITS) == 1


def test_saturated_waiting_handler_fans_out_to_all_workers():
    ten_ms_sleep = _window(5, 10_000_000, 20_000, active=1)  # busy the whole window
    assert target_workers(ten_ms_sleep, LIMITS) == 32


def test_waiting_handler_gets_workers_for_its_cpu_share():
    quarter_cpu = _window(50, 1_000_000, 250_000, active=2)  # 2 workers x 50 x 1 ms: saturated
    assert target_workers(quarter_cpu, LIMITS) == 3  # 0.8 / 0.25


def test_cpu_bound_handler_shrinks_to_one_worker():
    gil_bound = _window(400, 1_000_000, 900_000, active=8, window_ns=WINDOW_NS)
    assert target_workers(gil_bound, LIMITS) == 1


def test_idle_workers_do_not_grow():
    mostly_idle = _window(2, 1_000_000, 10_000, active=2)  # 2 ms of handler time in 50 ms
    assert target_workers(mostly_idle, LIMITS) == 2


def test_blocked_workers_double_and_quiet_window_keeps_the_count():
    assert target_workers(_window(0, 0, 0, active=4, blocked=True), LIMITS) == 8
    assert target_workers(_window(0, 0, 0, active=32, blocked=True), LIMITS) == 32
    assert target_workers(_window(0, 0, 0, active=4), LIMITS) == 4
    assert target_workers(_window(0, 0, 0, active=0), LIMITS) == 0  # inline, nothing to do
