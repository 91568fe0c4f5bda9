#!/usr/bin/env python3
"""Writes /metrics pages to test/fixtures/metrics/, rendered the way the engines render them.

Both engines export their load with prometheus_client in multiprocess mode: the processes that
own the numbers write them to mmap files under PROMETHEUS_MULTIPROC_DIR, and the process that
answers /metrics merges the files with multiprocess.MultiProcessCollector. This script does
the same: it forks one process per engine process, each declaring the metrics as the upstream
release declares them (name, documentation, label names, multiprocess_mode) and writing the
values that process writes, then renders the merged page with generate_latest, as the HTTP
process does. How the collector merges the files (a gauge's `pid` label, kept only in the
default multiprocess_mode "all") is prometheus_client's own code, not imitated here.

Pages (what each must read as is in test/engines/metrics.test.ts):

  vllm-api-servers.txt   vLLM with --api-server-count 4, a release before
      vllm-project/vllm#28792 (vllm/v1/metrics/loggers.py at commit 005a810b,
      PrometheusStatLogger): vllm:kv_cache_usage_perc has no multiprocess_mode, so the
      collector exports one series per API-server process with a `pid` label; the process
      that receives the engine's scheduler stats holds the usage, the others hold the 0.0 their
      make_per_engine() wrote. num_requests_running/waiting, gpu_cache_usage_perc and
      cache_config_info are "mostrecent" (one series); counters are summed (one series).
  vllm-hybrid-kv-size.txt  vLLM serving a hybrid (attention + Mamba) model, one API server,
      a release whose CacheConfig has kv_cache_size_tokens (vllm/config/cache.py: set after KV
      cache initialisation, the per-engine capacity in tokens, group-aware: num_gpu_blocks *
      block_size is wrong for hybrid models, whose requests occupy several KV cache groups).
      cache_config_info's labels are CacheConfig.metrics_info(), every field as a string, so
      the label is there as it is; the other gauges as in vllm-api-servers.txt.
  sglang-priority.txt    SGLang with --enable-metrics --enable-priority-scheduling
      (python/sglang/srt/observability/metrics_collector.py at commit 016d8605,
      SchedulerMetricsCollector.init_new and _log_gauge_queue_count): labels gain
      priority="", the queue/running totals are written under it and each priority's part
      under priority="<n>" (every priority seen so far, 0 when none is queued now).
  sglang-all-schedulers.txt  SGLang with --tp 2 --dp 2 --enable-metrics-for-all-schedulers:
      every scheduler process (tp_rank 0 and 1 of each dp_rank) writes its DP rank's counts;
      the two TP ranks of a DP rank write the same numbers.
  sglang-expert-parallel.txt SGLang with --tp 2 --ep-size 2 --enable-metrics-for-all-schedulers:
      moe_ep_rank = tp_rank // (tp_size // ep_size) at scheduler launch, so the two TP ranks
      differ in moe_ep_rank too and still write the same numbers.
  sglang-pd-prefill.txt  SGLang prefill server of a prefill-decode deployment,
      --disaggregation-mode prefill --enable-metrics
      (python/sglang/srt/observability/metrics_collector.py at commit 44cedc2b,
      SchedulerMetricsCollector.__init__ and log_stats; engine_type "prefill", as the scheduler
      writes it since sgl-project/sglang#18552, "unified" before): the scheduler sets
      num_prefill_prealloc_queue_reqs from its bootstrap queue and
      num_prefill_inflight_queue_reqs from its inflight (KV being sent) queue beside
      num_queue_reqs; log_stats writes the decode queues too, at SchedulerStats' default 0.
  sglang-pd-decode.txt   SGLang decode server of the same deployment, --disaggregation-mode
      decode --enable-metrics (same source, engine_type "decode"): num_decode_prealloc_queue_reqs
      and num_decode_transfer_queue_reqs from its prealloc and transfer queues, the prefill
      queues at 0. Later releases renamed the prefill gauge (016d8605:
      sglang:num_prefill_bootstrap_queue_reqs, "The number of requests in the prefill bootstrap
      queue."); these two pages are the release whose name is prealloc.
  sglang-pd-prefill-priority.txt  SGLang prefill server, --disaggregation-mode prefill
      --enable-metrics --enable-priority-scheduling, of release 016d8605
      (python/sglang/srt/observability/metrics_collector.py SchedulerMetricsCollector.init_new,
      log_stats and _log_gauge_queue_count; the scheduler's stats from
      managers/scheduler_components/metrics_reporter.py, QueueCount.from_reqs): the bootstrap
      queue is sglang:num_prefill_bootstrap_queue_reqs, and the four disaggregation queues are
      written as num_queue_reqs is, a total under priority="" and each known priority's part
      under priority="<n>"; the decode queues, never set on a prefill server, keep
      SchedulerStats' default QueueCount() (total 0, no breakdown): their total only.

Run: pip install prometheus_client && python3 scripts/gen-metrics-fixtures.py
"""
import os
import sys
import tempfile
import traceback
from pathlib import Path
from types import SimpleNamespace

OUT = Path(__file__).resolve().parent.parent / "test" / "fixtures" / "metrics"


def render(processes):
    """Runs each (process id, writer) in a forked process sharing one PROMETHEUS_MULTIPROC_DIR,
    then renders the merged page. The process id is given to prometheus_client's
    process_identifier hook, so the `pid` labels are the same on every run."""
    with tempfile.TemporaryDirectory() as d:
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = d
        for ident, writer in processes:
            child = os.fork()
            if child == 0:
                code = 0
                try:
                    from prometheus_client import values

                    values.ValueClass = values.MultiProcessValue(process_identifier=lambda: ident)
                    writer()
                except BaseException:
                    traceback.print_exc()
                    code = 1
                finally:
                    os._exit(code)
            _, status = os.waitpid(child, 0)
            if status != 0:
                sys.exit(f"writer {ident} failed")
        from prometheus_client import CollectorRegistry, generate_latest, multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=d)
        page = generate_latest(registry).decode()
        del os.environ["PROMETHEUS_MULTIPROC_DIR"]
        return page


# ---------------------------------------------------------------------------------------------
# vLLM, vllm/v1/metrics/loggers.py at 005a810bc40faa25b8870fbc8559c3462581eee3
# ---------------------------------------------------------------------------------------------

VLLM_MODEL = "Qwen/Qwen3-VL-8B-Instruct"
# CacheConfig.metrics_info(): the config's fields as strings (those the router reads, and a few)
VLLM_CACHE_CONFIG = {
    "block_size": "16",
    "cache_dtype": "auto",
    "enable_prefix_caching": "True",
    "gpu_memory_utilization": "0.9",
    "num_cpu_blocks": "None",
    "num_gpu_blocks": "17854",
    "prefix_caching_hash_algo": "builtin",
    "swap_space": "4",
}
# a hybrid model's CacheConfig on a release with kv_cache_size_tokens and kv_cache_max_concurrency:
# 320 blocks of 8 hold far fewer tokens than the engine's group-aware 463,459
VLLM_HYBRID_CACHE_CONFIG = {
    "block_size": "8",
    "cache_dtype": "auto",
    "enable_prefix_caching": "True",
    "gpu_memory_utilization": "0.8",
    "kv_cache_max_concurrency": "1.77",
    "kv_cache_size_tokens": "463459",
    "num_cpu_blocks": "None",
    "num_gpu_blocks": "320",
    "prefix_caching_hash_algo": "sha256",
}


def vllm_api_server(scheduler_stats, cache_config=VLLM_CACHE_CONFIG):
    """One API-server process: PrometheusStatLogger(vllm_config, engine_indexes=[0]), then
    log_engine_initialized(); record() only in the process that receives scheduler stats.
    cache_config: CacheConfig.metrics_info() of the engine."""

    def run():
        import prometheus_client as pc

        labelnames = ["model_name", "engine"]
        engine_indexes = [0]

        def make_per_engine(metric):
            return {idx: metric.labels(VLLM_MODEL, str(idx)) for idx in engine_indexes}

        running = make_per_engine(
            pc.Gauge(
                name="vllm:num_requests_running",
                documentation="Number of requests in model execution batches.",
                multiprocess_mode="mostrecent",
                labelnames=labelnames,
            )
        )
        waiting = make_per_engine(
            pc.Gauge(
                name="vllm:num_requests_waiting",
                documentation="Number of requests waiting to be processed.",
                multiprocess_mode="mostrecent",
                labelnames=labelnames,
            )
        )
        gpu_cache_usage = make_per_engine(
            pc.Gauge(
                name="vllm:gpu_cache_usage_perc",
                documentation=(
                    "GPU KV-cache usage. 1 means 100 percent usage."
                    "DEPRECATED: Use vllm:kv_cache_usage_perc instead."
                ),
                multiprocess_mode="mostrecent",
                labelnames=labelnames,
            )
        )
        gpu_prefix_queries = make_per_engine(
            pc.Counter(
                name="vllm:gpu_prefix_cache_queries",
                documentation=(
                    "GPU prefix cache queries, in terms of number of queried"
                    "tokens. DEPRECATED: Use vllm:prefix_cache_queries instead."
                ),
                labelnames=labelnames,
            )
        )
        gpu_prefix_hits = make_per_engine(
            pc.Counter(
                name="vllm:gpu_prefix_cache_hits",
                documentation=(
                    "GPU prefix cache hits, in terms of number of cached "
                    "tokens. DEPRECATED: Use vllm:prefix_cache_hits instead."
                ),
                labelnames=labelnames,
            )
        )
        # no multiprocess_mode: prometheus_client's default, "all" (fixed by #28792)
        kv_cache_usage = make_per_engine(
            pc.Gauge(
                name="vllm:kv_cache_usage_perc",
                documentation="KV-cache usage. 1 means 100 percent usage.",
                labelnames=labelnames,
            )
        )
        prefix_queries = make_per_engine(
            pc.Counter(
                name="vllm:prefix_cache_queries",
                documentation="Prefix cache queries, in terms of number of queried tokens.",
                labelnames=labelnames,
            )
        )
        prefix_hits = make_per_engine(
            pc.Counter(
                name="vllm:prefix_cache_hits",
                documentation="Prefix cache hits, in terms of number of cached tokens.",
                labelnames=labelnames,
            )
        )
        make_per_engine(
            pc.Counter(
                name="vllm:num_preemptions",
                documentation="Cumulative number of preemption from the engine.",
                labelnames=labelnames,
            )
        )
        ttft = make_per_engine(
            pc.Histogram(
                name="vllm:time_to_first_token_seconds",
                documentation="Histogram of time to first token in seconds.",
                buckets=[
                    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
                ],
                labelnames=labelnames,
            )
        )

        # log_engine_initialized() -> log_metrics_info("cache_config", ...)
        info = dict(cache_config, engine="")
        info_gauge = pc.Gauge(
            name="vllm:cache_config_info",
            documentation="Information of the LLMEngine CacheConfig",
            multiprocess_mode="mostrecent",
            labelnames=info.keys(),
        )
        for idx in engine_indexes:
            info_gauge.labels(**dict(cache_config, engine=str(idx))).set(1)

        if scheduler_stats is not None:
            idx = 0
            running[idx].set(scheduler_stats["num_running_reqs"])
            waiting[idx].set(scheduler_stats["num_waiting_reqs"])
            gpu_cache_usage[idx].set(scheduler_stats["kv_cache_usage"])
            kv_cache_usage[idx].set(scheduler_stats["kv_cache_usage"])
            gpu_prefix_queries[idx].inc(scheduler_stats["queries"])
            gpu_prefix_hits[idx].inc(scheduler_stats["hits"])
            prefix_queries[idx].inc(scheduler_stats["queries"])
            prefix_hits[idx].inc(scheduler_stats["hits"])
            ttft[idx].observe(0.042)

    return run


def vllm_api_servers():
    stats = {
        "num_running_reqs": 7,
        "num_waiting_reqs": 3,
        "kv_cache_usage": 0.6530455880475035,
        "queries": 12000,
        "hits": 9000,
    }
    # four API-server processes; the third receives the scheduler stats
    return render([(271 + i, vllm_api_server(stats if i == 2 else None)) for i in range(4)])


def vllm_hybrid_kv_size():
    stats = {"num_running_reqs": 2, "num_waiting_reqs": 0, "kv_cache_usage": 0.25, "queries": 4000, "hits": 1000}
    return render([(301, vllm_api_server(stats, VLLM_HYBRID_CACHE_CONFIG))])


# ---------------------------------------------------------------------------------------------
# SGLang, python/sglang/srt/observability/metrics_collector.py at
# 016d8605e45876180312e29d6988e1de06562472 (SchedulerMetricsCollector)
# ---------------------------------------------------------------------------------------------

SGLANG_MODEL = "Qwen/Qwen3-8B"


def sglang_gauge_writers(labels):
    """SchedulerMetricsCollector's _log_gauge and _log_gauge_queue_count over a scheduler's labels:
    a queue count's total under them and, with a breakdown, each priority any queue gauge has seen
    (one set per collector) under priority="<n>"."""
    known_priorities = set()

    def log_gauge(gauge, data):
        gauge.labels(**labels).set(data)

    def log_gauge_queue_count(gauge, data):
        total, by_priority = data
        gauge.labels(**labels).set(total)
        if by_priority is not None:
            known_priorities.update(by_priority.keys())
            for p in known_priorities:
                value = by_priority.get(p, 0)
                with_priority = dict(labels)
                with_priority["priority"] = str(p)
                gauge.labels(**with_priority).set(value)

    return log_gauge, log_gauge_queue_count


def sglang_scheduler(*, tp_rank, pp_rank=0, dp_rank=None, tp_size=1, ep_size=1, priority, stats):
    """One scheduler process: SchedulerMetricsCollector.init_new(...) then log_stats(stats).
    stats: running/queue as (total, {priority: count} or None), token_usage."""

    def run():
        from prometheus_client import Gauge

        # init_new: labels, in this order
        labels = {
            "model_name": SGLANG_MODEL,
            "engine_type": "unified",
            "tp_rank": tp_rank,
            "pp_rank": pp_rank,
            # the scheduler is launched with moe_ep_rank = tp_rank // (tp_size // ep_size)
            "moe_ep_rank": tp_rank // (tp_size // ep_size),
        }
        if priority:
            labels["priority"] = ""
        if dp_rank is not None:
            labels["dp_rank"] = dp_rank

        num_running_reqs = Gauge(
            name="sglang:num_running_reqs",
            documentation="The number of running requests.",
            labelnames=labels.keys(),
            multiprocess_mode="mostrecent",
        )
        num_queue_reqs = Gauge(
            name="sglang:num_queue_reqs",
            documentation="The number of requests in the waiting queue.",
            labelnames=labels.keys(),
            multiprocess_mode="mostrecent",
        )
        num_grammar_queue_reqs = Gauge(
            name="sglang:num_grammar_queue_reqs",
            documentation="The number of requests in the grammar waiting queue.",
            labelnames=labels.keys(),
            multiprocess_mode="mostrecent",
        )
        gen_throughput = Gauge(
            name="sglang:gen_throughput",
            documentation="The generation throughput (token/s).",
            labelnames=labels.keys(),
            multiprocess_mode="mostrecent",
        )
        token_usage = Gauge(
            name="sglang:token_usage",
            documentation="The token usage.",
            labelnames=labels.keys(),
            multiprocess_mode="mostrecent",
        )

        log_gauge, log_gauge_queue_count = sglang_gauge_writers(labels)

        # log_stats(stats), the lines for the names above, in its order
        log_gauge_queue_count(num_running_reqs, stats["running"])
        log_gauge_queue_count(num_queue_reqs, stats["queue"])
        log_gauge(num_grammar_queue_reqs, 0)
        log_gauge(gen_throughput, stats.get("gen_throughput", 0.0))
        log_gauge(token_usage, stats["token_usage"])

    return run


def sglang_priority():
    # QueueCount.from_reqs with enable_priority_scheduling: a Counter of the requests' priorities
    stats = {
        "running": (10, {0: 6, 5: 4}),
        "queue": (8, {0: 8}),
        "token_usage": 0.5,
        "gen_throughput": 812.5,
    }
    return render([(4101, sglang_scheduler(tp_rank=0, priority=True, stats=stats))])


def sglang_all_schedulers():
    per_dp = {
        0: {"running": (10, None), "queue": (4, None), "token_usage": 0.5},
        1: {"running": (6, None), "queue": (2, None), "token_usage": 0.25},
    }
    processes = []
    for dp_rank in (0, 1):
        for tp_rank in (0, 1):
            writer = sglang_scheduler(
                tp_rank=tp_rank, dp_rank=dp_rank, tp_size=2, priority=False, stats=per_dp[dp_rank]
            )
            processes.append((4200 + 10 * dp_rank + tp_rank, writer))
    return render(processes)


def sglang_expert_parallel():
    stats = {"running": (5, None), "queue": (1, None), "token_usage": 0.7}
    return render(
        [
            (4300 + tp_rank, sglang_scheduler(tp_rank=tp_rank, tp_size=2, ep_size=2, priority=False, stats=stats))
            for tp_rank in (0, 1)
        ]
    )


# ---------------------------------------------------------------------------------------------
# SGLang prefill-decode disaggregation, python/sglang/srt/observability/metrics_collector.py at
# 44cedc2b9c7dd31d9acae4498ea4fa0d3665feed (SchedulerMetricsCollector.__init__ and log_stats:
# the queue counts are plain gauges, no priority breakdown)
# ---------------------------------------------------------------------------------------------


SGLANG_GAUGE_HELP = {
    "sglang:num_running_reqs": "The number of running requests.",
    "sglang:token_usage": "The token usage.",
    "sglang:gen_throughput": "The generation throughput (token/s).",
    "sglang:num_queue_reqs": "The number of requests in the waiting queue.",
    "sglang:num_grammar_queue_reqs": "The number of requests in the grammar waiting queue.",
    "sglang:max_total_num_tokens": "Maximum total number of tokens in the KV cache pool.",
    "sglang:num_prefill_prealloc_queue_reqs": "The number of requests in the prefill prealloc queue.",
    "sglang:num_prefill_inflight_queue_reqs": "The number of requests in the prefill inflight queue.",
    "sglang:num_decode_prealloc_queue_reqs": "The number of requests in the decode prealloc queue.",
    "sglang:num_decode_transfer_queue_reqs": "The number of requests in the decode transfer queue.",
    "sglang:num_prefill_bootstrap_queue_reqs": "The number of requests in the prefill bootstrap queue.",
}
"""The documentation SchedulerMetricsCollector gives each gauge of the PD pages (the same in both releases)."""


def sglang_gauges(labels, names):
    """The gauges `names` over a scheduler's labels, declared in that order as the collector's
    __init__ declares them (multiprocess_mode "mostrecent"), each an attribute named as its metric
    without the "sglang:" prefix."""
    from prometheus_client import Gauge

    return SimpleNamespace(
        **{
            n.split(":", 1)[1]: Gauge(
                name=n,
                documentation=SGLANG_GAUGE_HELP[n],
                labelnames=labels.keys(),
                multiprocess_mode="mostrecent",
            )
            for n in names
        }
    )


def sglang_pd_scheduler(*, engine_type, stats):
    """One scheduler process of a --disaggregation-mode prefill or decode server (tp 1, no dp):
    SchedulerMetricsCollector(labels) then log_stats(stats). Each mode's log_*_stats sets only
    its own queues; log_stats writes all four, the other mode's at SchedulerStats' default 0."""

    def run():
        # labels as the scheduler builds them; engine_type is DisaggregationMode.to_engine_type(mode)
        labels = {
            "model_name": SGLANG_MODEL,
            "engine_type": engine_type,
            "tp_rank": 0,
            "pp_rank": 0,
            "moe_ep_rank": 0,
        }

        g = sglang_gauges(
            labels,
            [
                "sglang:num_running_reqs",
                "sglang:token_usage",
                "sglang:gen_throughput",
                "sglang:num_queue_reqs",
                "sglang:num_grammar_queue_reqs",
                "sglang:max_total_num_tokens",
                "sglang:num_prefill_prealloc_queue_reqs",
                "sglang:num_prefill_inflight_queue_reqs",
                "sglang:num_decode_prealloc_queue_reqs",
                "sglang:num_decode_transfer_queue_reqs",
            ],
        )

        log_gauge, _ = sglang_gauge_writers(labels)

        # log_stats(stats), the lines for the names above, in its order
        log_gauge(g.num_running_reqs, stats["num_running_reqs"])
        log_gauge(g.token_usage, stats["token_usage"])
        log_gauge(g.gen_throughput, stats.get("gen_throughput", 0.0))
        log_gauge(g.num_queue_reqs, stats["num_queue_reqs"])
        log_gauge(g.num_grammar_queue_reqs, 0)
        log_gauge(g.max_total_num_tokens, stats["max_total_num_tokens"])
        log_gauge(g.num_prefill_prealloc_queue_reqs, stats.get("num_prefill_prealloc_queue_reqs", 0))
        log_gauge(g.num_prefill_inflight_queue_reqs, stats.get("num_prefill_inflight_queue_reqs", 0))
        log_gauge(g.num_decode_prealloc_queue_reqs, stats.get("num_decode_prealloc_queue_reqs", 0))
        log_gauge(g.num_decode_transfer_queue_reqs, stats.get("num_decode_transfer_queue_reqs", 0))

    return run


def sglang_pd_prefill():
    # log_prefill_stats: running batch, waiting queue, bootstrap queue (requests whose decode
    # server has not yet taken the KV transfer on) and inflight queue (prefilled, KV being sent)
    stats = {
        "num_running_reqs": 3,
        "num_queue_reqs": 4,
        "num_prefill_prealloc_queue_reqs": 6,
        "num_prefill_inflight_queue_reqs": 9,
        "token_usage": 0.25,
        "max_total_num_tokens": 262144,
    }
    return render([(4401, sglang_pd_scheduler(engine_type="prefill", stats=stats))])


def sglang_pd_decode():
    # log_decode_stats: running batch, waiting queue (KV received), prealloc queue (waiting for
    # this server's KV memory) and transfer queue (memory held, KV arriving)
    stats = {
        "num_running_reqs": 48,
        "num_queue_reqs": 2,
        "num_decode_prealloc_queue_reqs": 5,
        "num_decode_transfer_queue_reqs": 7,
        "token_usage": 0.75,
        "gen_throughput": 1530.5,
        "max_total_num_tokens": 524288,
    }
    return render([(4501, sglang_pd_scheduler(engine_type="decode", stats=stats))])


# ---------------------------------------------------------------------------------------------
# SGLang prefill-decode disaggregation with priority scheduling, metrics_collector.py at
# 016d8605e45876180312e29d6988e1de06562472 (SchedulerMetricsCollector.init_new, log_stats,
# _log_gauge_queue_count, emit_constants)
# ---------------------------------------------------------------------------------------------


def sglang_pd_priority_scheduler(*, engine_type, stats):
    """One scheduler process of a --disaggregation-mode server with --enable-priority-scheduling
    (tp 1, no dp): SchedulerMetricsCollector.init_new(...), emit_constants(...) at startup, then
    log_stats(stats). stats: each queue count as (total, {priority: count} or None), the
    QueueCount the scheduler hands over (None: SchedulerStats' default, never set by this mode)."""

    def run():
        # init_new: labels, in this order; engine_type is DisaggregationMode.to_engine_type(mode)
        labels = {
            "model_name": SGLANG_MODEL,
            "engine_type": engine_type,
            "tp_rank": 0,
            "pp_rank": 0,
            "moe_ep_rank": 0,
            "priority": "",
        }

        # __init__, the gauges of the names below, in its order
        g = sglang_gauges(
            labels,
            [
                "sglang:num_running_reqs",
                "sglang:num_queue_reqs",
                "sglang:num_grammar_queue_reqs",
                "sglang:gen_throughput",
                "sglang:token_usage",
                "sglang:num_prefill_bootstrap_queue_reqs",
                "sglang:num_prefill_inflight_queue_reqs",
                "sglang:num_decode_prealloc_queue_reqs",
                "sglang:num_decode_transfer_queue_reqs",
                "sglang:max_total_num_tokens",
            ],
        )

        log_gauge, log_gauge_queue_count = sglang_gauge_writers(labels)

        # emit_constants, once at startup
        log_gauge(g.max_total_num_tokens, stats["max_total_num_tokens"])
        # log_stats(stats), the lines for the names above, in its order
        no_breakdown = (0, None)
        log_gauge_queue_count(g.num_running_reqs, stats["running"])
        log_gauge_queue_count(g.num_queue_reqs, stats["queue"])
        log_gauge(g.num_grammar_queue_reqs, 0)
        log_gauge(g.gen_throughput, stats.get("gen_throughput", 0.0))
        log_gauge(g.token_usage, stats["token_usage"])
        log_gauge_queue_count(g.num_prefill_bootstrap_queue_reqs, stats.get("prefill_bootstrap", no_breakdown))
        log_gauge_queue_count(g.num_prefill_inflight_queue_reqs, stats.get("prefill_inflight", no_breakdown))
        log_gauge_queue_count(g.num_decode_prealloc_queue_reqs, stats.get("decode_prealloc", no_breakdown))
        log_gauge_queue_count(g.num_decode_transfer_queue_reqs, stats.get("decode_transfer", no_breakdown))

    return run


def sglang_pd_prefill_priority():
    # a prefill stats pass (metrics_reporter.py): QueueCount.from_reqs of the waiting, bootstrap
    # and inflight queues, the running batch's count likewise; the decode queues are left unset
    stats = {
        "running": (3, {0: 2, 5: 1}),
        "queue": (4, {0: 1, 5: 3}),
        "prefill_bootstrap": (6, {0: 4, 5: 2}),
        "prefill_inflight": (9, {0: 9}),
        "token_usage": 0.25,
        "max_total_num_tokens": 262144,
    }
    return render([(4601, sglang_pd_priority_scheduler(engine_type="prefill", stats=stats))])


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    pages = {
        "vllm-api-servers.txt": vllm_api_servers(),
        "vllm-hybrid-kv-size.txt": vllm_hybrid_kv_size(),
        "sglang-priority.txt": sglang_priority(),
        "sglang-all-schedulers.txt": sglang_all_schedulers(),
        "sglang-expert-parallel.txt": sglang_expert_parallel(),
        "sglang-pd-prefill.txt": sglang_pd_prefill(),
        "sglang-pd-decode.txt": sglang_pd_decode(),
        "sglang-pd-prefill-priority.txt": sglang_pd_prefill_priority(),
    }
    for name, page in pages.items():
        (OUT / name).write_text(page)
        print(f"wrote {OUT / name} ({len(page)} bytes)")


if __name__ == "__main__":
    main()
