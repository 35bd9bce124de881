"""SGLang servers of one release, printing what they log: the release's own logging code, our values.

:class:`Server` is one prefill or decode server (its node, host, TP and DP sizes, KV pool),
logging through ``configure_logger`` with the scheduler's DP/TP prefix; :class:`Printer` holds
the release's pieces that print a request's lines (``RequestLogger`` and its targets,
``GenerateReqInput``, ``Req.log_time_stats`` with the time-stats class, ``validate_input_length``
with ``set_finish_with_abort``, ``FINISH_ABORT.to_json``, the tokenizer's context check and the
HTTP server's error line, the transfer-failure messages with ``KVTransferError``, the integrity
checks, the ``server_args`` line, the pool line and warning, the batch statistics, uvicorn's
formatters). What drives them is a run: scripts/make_sglang_fixtures.py (a scripted one per
release) or :mod:`replay.sglang_print.run` (a simulated log set).

What the values are is ours: rids, token counts, times, hosts, and the keys of a finished
request's ``meta_info`` (assembled in the tokenizer manager, too entangled to run). It changes
the process it runs in (the logging clock, ``sys.modules``, the root logger): one server per
process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import inspect
import io
import json
import logging
import logging.handlers
import re
import sys
import time
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from replay.sglang_print.release import Release


@dataclass(frozen=True)
class Setup:
    """What every server of the run shares: the model, the limits, the run's clocks."""

    epoch: float  # the wall clock (seconds since 1970) the run's times count from
    context: int = 1_048_576
    page: int = 64
    max_req_input_len: int = 681_278  # what the prefill scheduler admits (validate_input_length's limit)
    bootstrap_port: int = 8998
    model_path: str = "zai-org/GLM-5.3"
    served_model_name: str = "glm-5.3"
    perf0: float = 5000.0  # the schedulers' perf_counter at ``epoch``


@dataclass(frozen=True)
class Spec:
    """One server: its node name, role, address, parallelism and KV pool (tokens, per DP rank)."""

    node: str
    role: str  # prefill or decode
    host: str
    port: int
    pool: int
    tp_size: int = 2
    dp_size: int = 1  # above 1: DP attention, each DP rank its own pool
    #: server arguments other than the run's, as (name, value): printed where the release has them
    args: tuple[tuple[str, Any], ...] = ()


class Clock:
    """The run's clock: logging's ``time.time``, the schedulers' ``perf_counter``."""

    def __init__(self) -> None:
        self.epoch, self.perf0 = 0.0, 0.0
        self.now = 0.0

    def start(self, setup: Setup) -> None:
        self.epoch, self.perf0 = setup.epoch, setup.perf0
        self.now = setup.epoch

    def at(self, seconds: float) -> None:
        """Set the clock ``seconds`` after the run's epoch."""
        self.now = self.epoch + seconds

    def perf(self) -> float:
        return self.now - self.epoch + self.perf0


CLOCK = Clock()

#: The scheduler's module, which flushes the caches (``Scheduler.flush_cache``) and says so
SCHEDULER = "sglang.srt.managers.scheduler"
FLUSHED = "Cache flushed successfully!"
#: Its line where it retracts running requests under memory pressure (``update_running_batch``)
RETRACTED = "Retract requests"
#: From 0.5.18 only the stats-logging rank prints it (each DP rank's attention-TP rank 0)
_FLUSH_GUARD = re.compile(
    r"if self\.(?:metrics_reporter\.)?is_stats_logging_rank:\s*\n\s*logger\.info\(\"Cache flushed")


def flush_guarded(release: Release) -> bool:
    """Whether the release prints its ``Cache flushed successfully!`` on each DP rank's first
    scheduler only (0.5.18 on), not on every scheduler (to 0.5.12)."""
    src = release.source(SCHEDULER)
    assert f'logger.info("{FLUSHED}")' in src, release.version
    return _FLUSH_GUARD.search(src) is not None


#: How long a bootstrap that never completes waits before the prefill gives up (seconds): past the
#: releases' default bootstrap timeout of 300 s, so each release's own check fires.
BOOTSTRAP_WAIT = 300.2


def start_clock(setup: Setup) -> None:
    """Run logging (``LogRecord`` reads logging's ``time``, ``TimedRotatingFileHandler`` its
    handlers module's: a ``--log-requests-target`` file rotates by the run's hours), the release's
    ``datetime.now`` and the schedulers' ``perf_counter`` on :data:`CLOCK`, in UTC."""
    import logging.handlers
    import os
    CLOCK.start(setup)
    os.environ["TZ"] = "UTC"
    time.tzset()
    fake = types.SimpleNamespace(**{k: getattr(time, k) for k in dir(time) if not k.startswith("_")})
    fake.time = lambda: CLOCK.now
    fake.time_ns = lambda: int(CLOCK.now * 1e9)
    fake.perf_counter = CLOCK.perf
    logging.time = fake  # type: ignore[attr-defined]
    logging.handlers.time = fake  # type: ignore[attr-defined]


class Server:
    """One SGLang server (prefill or decode) of one release, logging to ``out`` (its stdout)."""

    def __init__(self, release: Release, spec: Spec, setup: Setup, form: str, target: Path | None,
                 out: Any = None, log_ms: bool = False, level: int = 1):
        self.r, self.spec, self.setup, self.form = release, spec, setup, form
        self.level = level  # --log-requests-level: 2 and 3 log the prompt and output text (2 cut to 2048)
        self.log_ms = log_ms  # SGLANG_LOG_MS=1: milliseconds in the log prefix's time
        self.role = spec.role
        self.out = out if out is not None else io.StringIO()
        self.sources: dict[str, str] = {}
        self.common = self._common()
        self.process: str | None = None  # the process whose logger is configured (tokenizer or a scheduler prefix)
        self.server_args = types.SimpleNamespace(log_level="info")
        self.target = target
        self.tp_size = spec.tp_size

    # -- what the release's code is --------------------------------------------------------

    def note(self, kind: str, module: str, marker: str, line: int | None = None) -> None:
        """Record where a line type comes from: file and line in this release."""
        with contextlib.suppress(LookupError, FileNotFoundError):
            self.sources.setdefault(kind, f"{self.r.path_of(module)}:{line or self.r.line_of(module, marker)}")

    def _common(self) -> types.ModuleType:
        mod = "sglang.srt.utils.common" if self.r.has("sglang.srt.utils.common") else "sglang.srt.utils"
        envs = types.SimpleNamespace(SGLANG_LOG_MS=types.SimpleNamespace(get=lambda: self.log_ms))
        return self.r.module(mod, ["configure_logger", "get_bool_env_var"], values={"envs": envs})

    def configure(self, prefix: str) -> None:
        """Switch the logging to one process of the server: ``""`` the HTTP/tokenizer process,
        ``" TP0"`` (etc.) a scheduler, as ``configure_logger`` sets it up there."""
        if self.process == prefix:
            return
        with contextlib.redirect_stderr(self.out):
            self.common.configure_logger(self.server_args, prefix=prefix)
        for handler in logging.getLogger().handlers:
            handler.setStream(self.out)  # type: ignore[attr-defined]
        self.process = prefix
        self.note("prefix", self.common.__name__, 'format = f"[%(asctime)s')

    def prefix(self, tp: int, dp: int | None) -> str:
        """The scheduler's logger prefix, from the release's own fragments."""
        mod = "sglang.srt.managers.scheduler"
        src = self.r.source(mod)
        within = next(f for f in ("configure_scheduler_process", "configure_scheduler", "run_scheduler_process")
                      if f"def {f}(" in src)
        out = ""
        if dp is not None:
            out += self.r.message(mod, " DP", within=within)(dp_rank=dp, shown_dp=dp)
        if self.tp_size > 1:
            out += self.r.message(mod, " TP", within=within)(tp_rank=tp, shown_tp=tp)
        return out

    def schedulers(self, dp_rank: int | None = None) -> list[str]:
        """The scheduler processes that log a request's lines: every TP rank; with DP attention,
        the TP ranks of the DP rank serving it."""
        if self.spec.dp_size > 1:
            d, per = dp_rank or 0, self.tp_size // self.spec.dp_size
            return [self.prefix(tp, d) for tp in range(d * per, (d + 1) * per)]
        return [self.prefix(tp, None) for tp in range(self.tp_size)]


class Lines(io.StringIO):
    """A server's stdout that gives its lines in the order of their times (each write of a
    handler is one record, stamped with :data:`CLOCK` as it is written); a run that prints
    request by request, not in time order, writes through it."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[tuple[float, int, str]] = []

    def write(self, text: str) -> int:
        self.records.append((CLOCK.now, len(self.records), text))
        return len(text)

    def getvalue(self) -> str:
        return "".join(text for _, _, text in sorted(self.records))


class Printer:
    """The release's pieces that print one server's lines; a run drives them (:meth:`play`)."""

    def __init__(self, server: Server):
        self.s = server
        self.r = server.r
        self.log = logging.getLogger("sglang.srt.managers.scheduler")
        self.tm_log = logging.getLogger("sglang.srt.managers.tokenizer_manager")
        self.http_log = logging.getLogger("sglang.srt.entrypoints.http_server")
        self.request_logger = self._request_logger()
        self.time_stats = self._time_stats()
        self.io = self._io_struct()
        self.finish = self._finish_reasons()
        #: whether the release's tokenizer puts response_sent_to_client_ts in a finish's meta_info
        self.sends_time = "response_sent_to_client_ts" in self.r.source("sglang.srt.managers.tokenizer_manager")
        #: the key under which the release's tokenizer puts a request's retractions in its meta_info
        self.retractions_key = retractions_key(self.r)
        server.note("finish_retractions", "sglang.srt.managers.tokenizer_manager",
                    f'"{self.retractions_key}": recv_obj.retraction_counts')
        self._objs: dict[str, Any] = {}

    def _obj_of(self, req: Any) -> Any:
        return self._objs[req.rid]

    # -- pieces of the release -------------------------------------------------------------

    def _request_logger(self) -> Any:
        r = self.r
        if not r.has("sglang.srt.utils.request_logger"):
            mod = "sglang.srt.utils.common" if r.has("sglang.srt.utils.common") else "sglang.srt.utils"
            self.s.note("request_text", "sglang.srt.managers.tokenizer_manager", "Receive: obj=")
            return _InlineRequestLog(r, r.module(mod, ["dataclass_to_string_truncated"]), self.s)
        real: dict[str, Any] = {}
        if has_targets(r):
            real["sglang.srt.utils.log_utils"] = None
        envs = types.SimpleNamespace(
            SGLANG_LOG_REQUEST_EXCEEDED_MS=types.SimpleNamespace(get=lambda: 0),
            SGLANG_LOG_REQUEST_HEADERS=types.SimpleNamespace(get=lambda: []),
        )
        values = {"envs": envs, "get_context": lambda: types.SimpleNamespace(
            is_config_namespace_published=lambda ns: False)}
        m = r.module("sglang.srt.utils.request_logger", real=real, values=values)
        if has_targets(r):
            lu: Any = sys.modules["sglang.srt.utils.log_utils"]
            lu.datetime = _FakeDatetime  # log_json's timestamp
            lu.dist = types.SimpleNamespace(is_initialized=lambda: True, get_rank=lambda: 0)
            lu.socket = types.SimpleNamespace(gethostname=lambda: self.s.spec.host.replace(".", "-"))
            self.s.note("request_target", "sglang.srt.utils.log_utils", "def _create_logger_with_handler")
        else:
            m.datetime = _FakeDatetime
            m._json_handler.setStream(self.s.out)
        if hasattr(m, "redact_watermark_secrets"):
            m.redact_watermark_secrets = lambda data, **_: data
        self.s.note("request_text", "sglang.srt.utils.request_logger", "Receive: obj=")
        self.s.note("request_json", "sglang.srt.utils.request_logger", '"request.received"')
        target = [str(self.s.target)] if self.s.target is not None else None
        kwargs: dict[str, Any] = {"log_requests": True, "log_requests_level": self.s.level,
                                  "log_requests_format": self.s.form}
        if "log_requests_target" in inspect.signature(m.RequestLogger.__init__).parameters:
            kwargs["log_requests_target"] = target
        logger = m.RequestLogger(**kwargs)
        for t in getattr(logger, "targets", []):
            for h in t.handlers:
                if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler):
                    h.setStream(self.s.out)
                if isinstance(h, logging.handlers.TimedRotatingFileHandler):
                    # its first rollover, as the handler computes it for a file made as the server
                    # starts (from the file's mtime, which is the real clock's here)
                    h.rolloverAt = h.computeRollover(int(self.s.setup.epoch))
        return logger

    def _time_stats(self) -> Any:
        r = self.r
        real = {"sglang.srt.disaggregation.utils": ["DisaggregationMode"]}
        if r.has("sglang.srt.observability.req_time_stats"):
            mod, cls = "sglang.srt.observability.req_time_stats", "SchedulerReqTimeStats"
        else:
            mod, cls = "sglang.srt.metrics.collector", "TimeStats"
        m = r.module(mod, real=real)
        m.global_diff_realtime_monotonic = self.s.setup.epoch - self.s.setup.perf0
        self.dm = sys.modules["sglang.srt.disaggregation.utils"].DisaggregationMode
        self.s.note("time_stats", "sglang.srt.managers.schedule_batch", "def log_time_stats")
        return getattr(m, cls)

    def _io_struct(self) -> types.ModuleType:
        import ast
        tree = self.r.tree("sglang.srt.managers.io_struct")
        defined = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
        names, todo = [], ["GenerateReqInput"]
        while todo:  # the class and the bases the module defines
            name = todo.pop()
            names.append(name)
            todo += [b.id for b in defined[name].bases if isinstance(b, ast.Name) and b.id in defined]
        return self.r.module("sglang.srt.managers.io_struct", names)

    def _finish_reasons(self) -> types.ModuleType:
        return self.r.module("sglang.srt.managers.schedule_batch",
                             ["BaseFinishReason", "FINISH_ABORT", "FINISH_LENGTH", "FINISH_MATCHED_TOKEN"])

    # -- what a run prints -----------------------------------------------------------

    def startup(self, layout: str | None = None) -> None:
        """What the server prints as it starts: ``server_args``, the pool line and the pool
        warning, uvicorn's start-up. The scheduler prints the pool line where its global TP rank
        is 0 (``if tp_rank == 0``, every release): with DP attention the ranks run on across the
        DP ranks, so only DP0's first scheduler prints it, although every DP rank has a pool of
        that size. With ``layout`` (one of :data:`LAYOUTS`), its model runner first prints what
        its KV pool is (:meth:`pool_layout`)."""
        s = self.s
        s.configure("")
        self._server_args()
        s.configure(s.schedulers(0 if s.spec.dp_size > 1 else None)[0])
        if layout is not None:
            self.pool_layout(layout)
        self._pool_line()
        self._pool_warning()
        self._uvicorn_startup()

    def warmup(self, at: float) -> bool:
        """The start-up warmup of a disaggregated server, from 0.5.18 (``_execute_server_warmup``
        in ``entrypoints/http_server.py``): one ``/generate`` per DP rank, sent by the server
        itself to the fake bootstrap host 2.2.2.2 with the DP rank as its room and no rid (the
        request's own ``normalize_batch_and_arguments`` assigns one: ``uuid4``, drawn here from a
        seeded generator so that a run prints the same bytes), logged by the request logger and
        answered 200, between the release's own start and end messages. False, printing nothing,
        for a release whose warmup is the batched one of before 0.5.18 (not scripted)."""
        import random
        import uuid

        r, s = self.r, self.s
        mod = "sglang.srt.entrypoints.http_server"
        if "routed_dp_rank" not in r.source(mod):
            return False
        CLOCK.at(at)
        s.configure("")
        log = logging.getLogger(mod)
        log.info(r.message(mod, "Start of pd disaggregation warmup")())
        s.note("warmup", mod, "Start of pd disaggregation warmup")
        cls, draw = self.io.GenerateReqInput, random.Random(f"{s.spec.node}-warmup-{at}")
        fields = {f.name for f in dataclasses.fields(cls)}
        real = uuid.uuid4
        uuid.uuid4 = lambda: uuid.UUID(int=draw.getrandbits(128), version=4)
        try:
            for dp in range(s.spec.dp_size):
                kwargs = {"sampling_params": {"temperature": 0.0, "max_new_tokens": 8, "ignore_eos": True},
                          "bootstrap_host": "2.2.2.2", "bootstrap_room": dp, "input_ids": [10, 11, 12, 13],
                          "routed_dp_rank": dp}
                obj = cls(**{k: v for k, v in kwargs.items() if k in fields})
                with contextlib.suppress(Exception):
                    obj.normalize_batch_and_arguments()
                self.request_logger.log_received_request(obj)
                self._finish(obj, obj.rid, 4, 8 if s.role == "decode" else 1, None, at + 0.05 + 0.01 * dp)
        finally:
            uuid.uuid4 = real
        CLOCK.at(at + 0.1)
        s.configure("")
        log.info(r.percent_message(mod, "Disaggregation warmup requests completed")(
            num_dp_ranks=s.spec.dp_size, dp_size=s.spec.dp_size))
        log.info(r.message(mod, "End of disaggregation warmup")())
        return True

    def _server_args(self) -> None:
        r, s = self.r, self.s
        engine = "sglang.srt.entrypoints.engine"
        fields = server_args_fields(r)
        spec, setup = s.spec, s.setup
        values = {**fields, "model_path": setup.model_path, "served_model_name": setup.served_model_name,
                  "context_length": setup.context, "page_size": setup.page, "tp_size": spec.tp_size,
                  "dp_size": spec.dp_size, "enable_dp_attention": spec.dp_size > 1,
                  "disaggregation_mode": s.role, "disaggregation_transfer_backend": "mooncake",
                  "disaggregation_bootstrap_port": setup.bootstrap_port, "host": spec.host, "port": spec.port,
                  "log_requests": True, "log_requests_level": s.level, "log_requests_format": s.form,
                  "enable_request_time_stats_logging": True, **dict(spec.args)}
        if "attn_dp_size" in fields:  # (0.5.23 resolves --enable-dp-attention --dp N to attn_dp_size N)
            values.update(attn_dp_size=spec.dp_size, dp_size=1)
        values = {k: v for k, v in values.items() if k in fields}
        if "server_args.resolved_dict()" in r.source(engine) or "_server_args_for_logging" in r.source(engine):
            text = r.message(engine, "server_args=")(server_args=_Dict(values), _server_args_for_logging=dict)
        else:
            sa = dataclasses.make_dataclass("ServerArgs", list(values))(**values)
            text = r.message(engine, "server_args=")(server_args=sa)
        s.note("server_args", engine, "server_args=")
        logging.getLogger("sglang.srt.entrypoints.engine").info(text)

    def pool_layout(self, layout: str) -> None:
        """The lines a model runner prints as it sizes and makes a KV pool of another layout than
        the plain paged one (:data:`LAYOUTS`), each through the release's own string and logger."""
        for mod, marker, values in layout_lines_of(self.r, layout):
            self.s.note(f"layout_{layout}: {marker.strip()}", mod, marker)
            logging.getLogger(mod).info(self.r.message(mod, marker)(**values))

    def _pool_line(self) -> None:
        mod = "sglang.srt.managers.scheduler"
        text = self.r.message(mod, "max_total_num_tokens=")(
            max_total_num_tokens=self.s.spec.pool, chunked_prefill_size=8192, max_prefill_tokens=16384,
            max_running_requests=48, context_len=self.s.setup.context, device="cuda", avail_mem=21.37,
            startup_available_gpu_memory_gb=21.37)
        self.s.note("pool", mod, "max_total_num_tokens=")
        self.log.info(text)

    def _batch_line(self, running: int = 1) -> None:
        """The head of a batch-statistics line (the rest is assembled piecemeal), ``running`` the
        requests in the running batch."""
        marker = "Prefill batch" if self.s.role == "prefill" else "Decode batch"
        mod = batch_module(self.r, marker)
        text = self.r.message(mod, marker)(
            iter_msg="", can_run_list=[1], log_input_tokens=900, log_hit_tokens=0,
            token_usage_msg="token usage: 0.00, ",
            running_bs=running, waiting_queue=[], num_running_reqs=running, num_used=900, token_usage=0.0,
            cuda_graph=True, can_run_cuda_graph=True, new_token_ratio=0.7, last_gen_throughput=41.2,
            gen_throughput=41.2, batch=types.SimpleNamespace(reqs=[1] * running), num_batch_reqs=running,
            num_new_seqs=1, new_token=900, cached_token=0, num_new_seq=1, num_cached_tokens=0, num_new_tokens=900,
            num_queue_reqs=0, num_pending_tokens=0, num_running_req=running)
        self.s.note("batch_stats", mod, marker)
        self.log.info(text)

    def cache_flushed(self) -> None:
        """``Scheduler.flush_cache`` done on an idle server: its ``Cache flushed successfully!`` on
        the schedulers that print it (:func:`flush_guarded`), one DP rank after another."""
        guarded = flush_guarded(self.r)
        self.s.note("cache_flushed", SCHEDULER, FLUSHED)
        ranks: list[int | None] = list(range(self.s.spec.dp_size)) if self.s.spec.dp_size > 1 else [None]
        for dp in ranks:
            printers = self.s.schedulers(dp)
            for prefix in printers[:1] if guarded else printers:
                self.s.configure(prefix)
                logging.getLogger(SCHEDULER).info(FLUSHED)

    def retracted(self, count: int = 1, schedulers: list[str] | None = None, gained: int = 1024,
                  ratios: tuple[float, float] = (0.7, 0.35)) -> None:
        """``Scheduler.update_running_batch`` retracted ``count`` running requests under memory
        pressure (``gained`` tokens freed, its new-token ratio from one value to the other): its
        ``KV cache pool is full. Retract requests. #retracted_reqs: N, ...``, built and logged by the
        release's own statements (at INFO in 0.5.5, a warning from 0.5.7), on every scheduler of
        the DP rank (no rank guard): ``schedulers``, else the server's (its first DP rank's)."""
        level, text = self.r.logged(SCHEDULER, RETRACTED, within="update_running_batch")(
            retracted_reqs=[None] * count, new_token_gained=gained, mamba_num_gained=None,
            kv_full_retract_flag=True, old_ratio=ratios[0], new_token_ratio=ratios[1])
        self.s.note("retracted", SCHEDULER, RETRACTED)
        for prefix in schedulers if schedulers is not None else self.s.schedulers(
                0 if self.s.spec.dp_size > 1 else None):
            self.s.configure(prefix)
            getattr(logging.getLogger(SCHEDULER), level)(text)

    def _pool_warning(self) -> None:
        """0.5.23 on: the warning that the pool cannot hold one full-context request."""
        mod = "sglang.srt.managers.tp_worker"
        if not self.r.has(mod) or "fewer than --context-length" not in self.r.source(mod):
            return
        pool, context = self.s.spec.pool, self.s.setup.context
        if pool >= context:  # (as the release checks it)
            return
        text = self.r.percent_message(mod, "fewer than --context-length")(kv_capacity=pool, context_len=context)
        self.s.note("pool_warning", mod, "fewer than --context-length")
        logging.getLogger(mod).warning(text)

    def _uvicorn_startup(self) -> None:
        import logging.config

        import uvicorn.config
        cfg = json.loads(json.dumps(uvicorn.config.LOGGING_CONFIG))
        cfg["disable_existing_loggers"] = False
        cfg["formatters"]["default"]["use_colors"] = False
        cfg["formatters"]["access"]["use_colors"] = False
        logging.config.dictConfig(cfg)
        for name in ("uvicorn", "uvicorn.access", "uvicorn.error"):
            for h in logging.getLogger(name).handlers:
                h.setStream(self.s.out)  # type: ignore[attr-defined]
        err = logging.getLogger("uvicorn.error")
        err.info("Started server process [%d]", 4242)
        err.info("Waiting for application startup.")
        err.info("Application startup complete.")
        err.info("Uvicorn running on %s://%s:%d (Press CTRL+C to quit)", "http", self.s.spec.host, self.s.spec.port)
        self.access = logging.getLogger("uvicorn.access")

    def _access(self, status: int) -> None:
        self.access.info('%s - "%s %s HTTP/%s" %d', "10.0.0.2:51822", "POST", "/generate", "1.1", status)

    def _obj(self, rid: str | None, prompt: int, output: int, room: int, bootstrap_host: str,
             text: str | None = None) -> Any:
        """The request as the tokenizer logs it: its ``rid`` (None: the request's own
        ``normalize_batch_and_arguments`` assigns one, as where no client or router gives it) and
        eight token ids, or its prompt ``text`` instead."""
        cls = self.io.GenerateReqInput
        fields = {f.name for f in dataclasses.fields(cls)}
        kwargs: dict[str, Any] = {
            "rid": rid, "input_ids": [1] * 8, "sampling_params": {"max_new_tokens": output, "temperature": 0.0},
            "stream": False, "bootstrap_host": bootstrap_host, "bootstrap_port": self.s.setup.bootstrap_port,
            "bootstrap_room": room}
        if rid is None:
            del kwargs["rid"]
        if text is not None:
            kwargs["text"] = text
            del kwargs["input_ids"]
        obj = cls(**{k: v for k, v in kwargs.items() if k in fields})
        with contextlib.suppress(Exception):
            obj.normalize_batch_and_arguments()
        return obj

    def _req(self, rid: str, prompt: int, room: int) -> Any:
        """A stand-in ``Req`` of ``prompt`` tokens with the release's time-stats object, as this
        server's scheduler holds it (what ``log_time_stats`` and ``set_finish_with_abort`` read)."""
        mode = self.dm.PREFILL if self.s.role == "prefill" else self.dm.DECODE
        return types.SimpleNamespace(
            rid=rid, bootstrap_room=room, origin_input_ids=[0] * prompt, output_ids=[], cached_tokens=0,
            prefill_attempt_count=1, time_stats=self.time_stats(disagg_mode=mode), has_log_time_stats=False,
            multimodal_inputs=None, grammar=None, return_logprob=False, logprob_start_len=-1, to_finish=None,
            release_mm_inputs_on_abort=lambda: None)

    def _log_time_stats(self, req: Any) -> None:
        fn = self.r.method("sglang.srt.managers.schedule_batch", "Req", "log_time_stats", {"logger": self.log})
        req.has_log_time_stats = False
        fn(req)

    def _validate(self, req: Any, schedulers: list[str]) -> dict[str, Any]:
        mod = "sglang.srt.managers.utils"
        utils = self.r.module(mod, ["validate_input_length"])
        error = utils.validate_input_length(req, self.s.setup.max_req_input_len, False)
        self.s.note("length_abort", mod, "exceeds ")
        rank = [0]
        abort = self.r.method("sglang.srt.managers.schedule_batch", "Req", "set_finish_with_abort", {
            "logger": self.log, "FINISH_ABORT": self.finish.FINISH_ABORT,
            "HTTPStatus": _HTTPStatus, "array": lambda code, xs: list(xs),
            "get_parallel": lambda: types.SimpleNamespace(tp_rank=rank[0]),
            "get_tensor_model_parallel_rank": lambda: rank[0]})
        self.s.note("abort_error", "sglang.srt.managers.schedule_batch", "def set_finish_with_abort")
        for prefix in schedulers:  # every TP rank validates; the method decides which ranks log
            self.s.configure(prefix)
            rank[0] = _tp_of(prefix)
            abort(req, error)
        return req.to_finish.to_json()

    def _conn(self) -> str:
        """The module holding the release's ``KVTransferError`` (the transfer backends' shared
        connection code, or Mooncake's own in early releases)."""
        return next(m for m in ("sglang.srt.disaggregation.common.conn", "sglang.srt.disaggregation.mooncake.conn",
                                "sglang.srt.disaggregation.common.utils") if self.r.has(m)
                    and "class KVTransferError" in self.r.source(m))

    def _transfer_failed(self, req: Any, room: int, schedulers: list[str], side: str,
                         reason: str = "Failed to get kvcache from prefill instance, it might be dead",
                         stage: str = "transfer") -> None:
        """The queue's failure line on each scheduler of the request (``stage``: ``transfer``,
        or ``bootstrap`` on prefill and ``handshake`` on decode), the exception the release
        raises for ``reason`` appended, at the level the release logs it."""
        r = self.r
        kv_error = r.module(self._conn(), ["KVTransferError"]).KVTransferError
        mod = f"sglang.srt.disaggregation.{side}"
        # where the release marks errors propagated from another rank, only the first logs at
        # warning/error (the rest at debug, not printed); before, every rank logs its own
        muted = "is_from_another_rank" in r.source(mod)
        marker = f"{side.capitalize()} {stage} failed"
        head = r.message(mod, marker)
        tail = r.message(mod, " with exception ")
        self.s.note(f"{side}_{stage}_failed", mod, marker)
        log = logging.getLogger(mod)
        level = _level_after(r, mod, marker)
        for n, prefix in enumerate(schedulers):
            self.s.configure(prefix)
            err = kv_error(room, reason, True) if muted and n else kv_error(room, reason)
            facts = {"tp_rank": _tp_of(prefix), "rid": req.rid, "bootstrap_room": room, "e": err}
            message = head(**facts) + tail(**facts)
            if n == 0:
                self._last_error = message
            if muted and n:
                log.debug(message)
            else:
                getattr(log, level)(message)

    def _bootstrap_failed(self, req: Any, room: int, schedulers: list[str], at: float) -> None:
        """The bootstrap never completes: decode cannot fetch the prefill's parallel info from
        its bootstrap server (the receiver's failure: decode's handshake fails at once) and the
        prefill, never sent the KV indices, times out in ``KVPoll.Bootstrapping`` after the
        release's default 300 s (the sender's failure, and its warning, printed once per process)."""
        r, s = self.r, self.s
        conn = self._conn()
        if s.role == "decode":
            mod = next(m for m in (conn, "sglang.srt.disaggregation.mooncake.conn") if r.has(m)
                       and "Could not fetch prefill parallel info" in r.source(m))
            reason = r.message(mod, "Could not fetch prefill parallel info")(
                bootstrap_addr=f"{self._obj_of(req).bootstrap_host}:{s.setup.bootstrap_port}")
            s.note("fetch_failure", mod, "Could not fetch prefill parallel info")
            CLOCK.at(at)
            self._transfer_failed(req, room, schedulers, "decode", reason, stage="handshake")
            return
        elapsed = BOOTSTRAP_WAIT
        reason = r.message(conn, "in KVPoll.Bootstrapping")(bootstrap_room=room, elapsed=elapsed)
        s.note("bootstrap_timeout", conn, "in KVPoll.Bootstrapping")
        CLOCK.at(at + elapsed)
        warning = r.message(conn, "Some requests timed out when bootstrapping")()
        for prefix in schedulers:  # (warning_once: each scheduler process prints it once)
            s.configure(prefix)
            logging.getLogger(conn).warning(warning)
        self._transfer_failed(req, room, schedulers, "prefill", reason, stage="bootstrap")

    def _context_rejection(self, obj: Any, prompt: int, at: float) -> None:
        """A prompt longer than the context: logged on arrival, then refused by the tokenizer
        (the HTTP server's error line and a 400; no finish line)."""
        r, s = self.r, self.s
        CLOCK.at(at)
        s.configure("")
        self.request_logger.log_received_request(obj)
        CLOCK.at(at + 0.003)
        mod = "sglang.srt.managers.tokenizer_manager"
        render, at_line = _raised(r, mod, "is longer than the ")
        msg = render(input_token_num=prompt, context_len=s.setup.context)
        s.note("context_rejection", mod, "is longer than the ", at_line)
        http = "sglang.srt.entrypoints.http_server"
        within = "serve_generate_request" if "def serve_generate_request" in r.source(http) else "generate_request"
        line = r.message(http, "Error: ", within=within)(e=msg)
        s.note("http_error", http, "Error: ")
        self.http_log.error(line)
        self._access(400)

    def _abort_json(self, message: str, status: int) -> dict[str, Any]:
        return self.finish.FINISH_ABORT(message, _HTTPStatus(status)).to_json()

    def _finish(self, obj: Any, rid: str, prompt: int, output: int, aborted: dict[str, Any] | None, at: float,
                *, stop: bool = False, latency: float = 0.5, text: str = "", cached: int = 0,
                retractions: int = 0) -> None:
        """The request log's finish line at ``at`` (the abort's reason, else the length or, with
        ``stop``, the end-of-sequence token reached; ``text`` the output, logged at levels 2 and
        3; ``cached`` the prompt tokens the prefix cache gave; ``retractions`` the times decode
        retracted it), and uvicorn's access line. ``meta_info`` begins as the release's tokenizer
        builds it (id, finish reason, prompt tokens, the server's ``weight_version``, retractions)."""
        CLOCK.at(at)
        self.s.configure("")
        done = self.finish.FINISH_MATCHED_TOKEN(matched=2) if stop else self.finish.FINISH_LENGTH(length=output)
        reason = aborted or done.to_json()
        meta = {"id": rid, "finish_reason": reason, "prompt_tokens": prompt, "weight_version": "default",
                self.retractions_key: retractions, "completion_tokens": output, "cached_tokens": cached,
                "e2e_latency": latency}
        if self.sends_time:
            meta["response_sent_to_client_ts"] = CLOCK.now  # (the tokenizer sets it just before logging)
        out = {"text": text, "output_ids": [1] * output, "meta_info": meta}
        self.request_logger.log_finished_request(obj, out)
        status = 200 if aborted is None else int(aborted.get("status_code") or 500)
        self._access(status)



#: The model runner's lines of a KV pool the replay does not model, by layout: (the modules that
#: may hold the line, a marker in its string, the values it formats). ``swa``: a hybrid
#: sliding-window model's pools (``SWATokenToKVPoolAllocator``), sized by the model runner (0.5.5),
#: its KV cache mixin (0.5.7, 0.5.8) or its pool configurator (0.5.11 on), then made
#: (``SWAKVPool``); ``swa_only``: a model whose every layer is a sliding window's
#: (``PureSWATokenToKVPoolAllocator``, its sizing line); ``linear``: a hybrid linear-attention
#: model's recurrent state (SGLang's Mamba cache: the first of the release's lines, in some releases
#: the one a server with speculative decoding prints); ``unified``: the unified memory pool
#: (``--enable-unified-memory``, 0.5.18 on), here on a hybrid sliding-window model.
LAYOUTS: dict[str, tuple[tuple[str | tuple[str, ...], str, dict[str, Any]], ...]] = {
    "swa": (
        (("sglang.srt.model_executor.pool_configurator", "sglang.srt.model_executor.model_runner_kv_cache_mixin",
          "sglang.srt.model_executor.model_runner"),
         "window memory pool. ", {"full_tokens": 653_184, "swa_tokens": 522_496, "full_max_total_num_tokens": 653_184,
                                  "swa_max_total_num_tokens": 522_496}),
        (("sglang.srt.mem_cache.swa_memory_pool", "sglang.srt.mem_cache.memory_pool"), "SWAKVPool ",
         {"mem_usage": 41.5, "size_swa": 522_496, "size": 653_184, "post_capture_active": False}),
    ),
    "swa_only": (  # (every layer a sliding window's: 0.5.11 on)
        ("sglang.srt.model_executor.pool_configurator", "memory pool (all SWA)", {"swa_tokens": 522_496}),
    ),
    "linear": (
        ("sglang.srt.mem_cache.memory_pool", "Mamba Cache is allocated",
         {"size": 48, "get_tensor_size_bytes": lambda t: t, "conv_state": 0.25 * 2**30, "temporal_state": 3.5 * 2**30,
          "GB": 2**30, "intermediate_ssm_gb": 0.0, "intermediate_conv_gb": 0.0, "intermediate_ssm_state_cache": 0,
          "intermediate_conv_window_cache": 0, "_intermediate_conv_window_phys": 0}),
    ),
    "unified": (
        ("sglang.srt.mem_cache.unified_memory_pool", "UNIFIED MEMORY POOL ENABLED -- path=SWA hybrid", {}),
    ),
}


def layout_lines_of(r: Release, layout: str) -> list[tuple[str, str, dict[str, Any]]]:
    """The lines of ``layout`` (:data:`LAYOUTS`) the release prints: each its module, marker and values."""
    out = []
    for modules, marker, values in LAYOUTS[layout]:
        mod = next((m for m in (modules if isinstance(modules, tuple) else (modules,))
                    if r.has(m) and marker in r.source(m)), None)
        if mod is not None:  # (else a line the release does not print)
            out.append((mod, marker, values))
    return out


def retractions_key(r: Release) -> str:
    """The ``meta_info`` key of a request's retractions in the release's tokenizer manager:
    ``total_retractions`` to 0.5.11, ``num_retractions`` from 0.5.12 (every release sets it, to the
    times the decode scheduler retracted the request under memory pressure)."""
    found = re.search(r'"(\w+_retractions)": recv_obj\.retraction_counts\[i\]',
                      r.source("sglang.srt.managers.tokenizer_manager"))
    assert found is not None, r.version
    return found.group(1)


@contextlib.contextmanager
def drawn_uuids(seed: str) -> Any:
    """``uuid.uuid4`` drawn from a generator seeded with ``seed`` meanwhile: the ids a server
    assigns its requests itself, the same bytes at every run."""
    import random
    import uuid

    draw, real = random.Random(seed), uuid.uuid4
    uuid.uuid4 = lambda: uuid.UUID(int=draw.getrandbits(128), version=4)
    try:
        yield
    finally:
        uuid.uuid4 = real


def close_targets(printer: Printer) -> list[Path]:
    """Flush and close the request logger's ``--log-requests-target`` files (their handlers
    removed, as at the process's exit); the files, as the handlers last named them."""
    files = []
    for target in getattr(printer.request_logger, "targets", []):
        for h in list(target.handlers):
            if isinstance(h, logging.FileHandler):
                files.append(Path(h.baseFilename))
                h.close()
                target.removeHandler(h)
    return files


def has_targets(release: Release) -> bool:
    """Whether the release has ``--log-requests-target`` (its log targets in ``log_utils``)."""
    return release.has("sglang.srt.utils.log_utils")


def retires(r: Release) -> bool:
    """Whether the release retires a request rejected at intake before the prefill handoff
    (``PrefillBootstrapQueue.add`` calling ``retire_unadmitted_request``), rather than
    bootstrapping it and sending its one-token stub."""
    return "retire_unadmitted_request" in r.source("sglang.srt.disaggregation.prefill")


def marks_bootstrap_done(r: Release) -> bool:
    """Whether the release's decode marks a request's handshake done as it polls it
    (``set_bootstrap_done_time`` in ``disaggregation/decode.py``, 0.5.11 on): its time stats then
    print the preallocation as ``bootstrap`` and ``alloc_wait`` (with the whole in 0.5.11, alone
    from 0.5.12), as every served request's do in a real run."""
    return "set_bootstrap_done_time" in r.source("sglang.srt.disaggregation.decode")


def aborts_after_forward(r: Release) -> bool:
    """Whether the release runs a request rejected at intake as its one-token forward and then
    aborts it before the send (``_retire_aborted_prefill_result``: the sender aborted, nothing
    sent; 0.5.20), rather than sending the stub (up to 0.5.19) or retiring it at intake."""
    return "_retire_aborted_prefill_result" in r.source("sglang.srt.disaggregation.prefill") and not retires(r)


def batch_module(r: Release, marker: str) -> str:
    """The module whose batch-statistics line starts with ``marker`` (``Decode batch``,
    ``Prefill batch``) in this release."""
    return next(m for m in ("sglang.srt.managers.scheduler_components.metrics_reporter",
                            "sglang.srt.observability.scheduler_metrics_mixin",
                            "sglang.srt.managers.scheduler_metrics_mixin") if r.has(m) and marker in r.source(m))


def decode_log_interval(r: Release) -> int:
    """``--decode-log-interval``'s default in the release: the decode steps of a scheduler between
    two of its ``Decode batch`` lines."""
    value = server_args_fields(r).get("decode_log_interval")
    assert isinstance(value, int) and not isinstance(value, bool), (r.version, value)
    return value


def every_scheduler_logs_decode_batches(r: Release) -> bool:
    """Whether, started with ``--enable-metrics-for-all-schedulers``, every scheduler prints its
    ``Decode batch`` line, not only its DP rank's first (attention-TP rank 0). To 0.5.8 the flag
    lets each scheduler call ``log_decode_stats``, whose ``logger.info(msg)`` is unguarded; from
    0.5.11 that ``logger.info(msg)`` sits under ``if self.is_stats_logging_rank:`` (attention-TP
    rank 0), so the flag widens the metrics only, not the log."""
    if "enable_metrics_for_all_schedulers" not in server_args_fields(r):
        return False
    src = r.source(batch_module(r, "Decode batch"))
    return re.search(r"if self\.is_stats_logging_rank:\s*\n\s*logger\.info\(msg\)", src) is None


def _level_after(r: Release, module: str, marker: str) -> str:
    """The level (``warning`` or ``error``) of the first logging call after the message holding
    ``marker`` that is not a debug call (the muted branch)."""
    lines = r.source(module).splitlines()[r.line_of(module, marker):]
    for text in lines:
        if (m := re.search(r"logger\.(warning|error)\(", text)) is not None:
            return m.group(1)
    raise LookupError(f"no warning or error call after {marker!r} in {r.path_of(module)}")


def _tp_of(prefix: str) -> int:
    """The TP rank a scheduler's prefix names (0 where it names none)."""
    return int(prefix.rsplit("TP", 1)[-1]) if "TP" in prefix else 0


def _raised(r: Release, module: str, marker: str) -> tuple[Any, int]:
    """The message of the ``raise ValueError(...)`` holding ``marker`` (not the warning beside
    it), and its line."""
    import ast
    tree = r.tree(module)
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and marker in ast.unparse(node.exc):
            return r.message_of(module, node.exc.args[0]), node.lineno
    raise LookupError(f"no raise with {marker!r} in {module} of {r.version}")


def server_args_fields(r: Release) -> dict[str, Any]:
    """ServerArgs' fields in the release's order, with their defaults where they are literals."""
    import ast
    tree = r.tree("sglang.srt.server_args")
    classes = [next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ServerArgs")]
    if not any(isinstance(i, ast.AnnAssign) for i in classes[0].body):  # (0.5.23: fields in namespaces)
        folder = "sglang/srt/arg_groups/fields/"
        for path in sorted(p for p in r._zip.namelist() if p.startswith(folder) and p.endswith(".py")):
            module = path[:-3].replace("/", ".")
            classes += [n for n in r.tree(module).body if isinstance(n, ast.ClassDef)]
    out: dict[str, Any] = {}
    for item in (i for c in classes for i in c.body):
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            try:
                out[item.target.id] = ast.literal_eval(item.value) if item.value is not None else None
            except ValueError:
                out[item.target.id] = None
    return out


class _Dict(dict[str, Any]):
    """``server_args`` for releases that print ``server_args.resolved_dict()``."""

    def resolved_dict(self) -> dict[str, Any]:
        return dict(self)


class _HTTPStatus(int):
    """``HTTPStatus`` as SGLang passes it (an IntEnum: JSON gives the number, repr the enum)."""

    BAD_REQUEST: _HTTPStatus
    INTERNAL_SERVER_ERROR: _HTTPStatus


from http import HTTPStatus as _RealStatus  # noqa: E402

_HTTPStatus = _RealStatus  # type: ignore[misc,assignment]  # the real enum


class _FakeDatetime(dt.datetime):
    @classmethod
    def now(cls, tz: Any = None) -> Any:
        return dt.datetime.fromtimestamp(CLOCK.now, tz=tz) if tz else dt.datetime.utcfromtimestamp(CLOCK.now)


class _InlineRequestLog:
    """0.5.5's request log: inline in the tokenizer manager, through its module logger."""

    def __init__(self, r: Release, common: types.ModuleType, server: Server):
        self.mod = "sglang.srt.managers.tokenizer_manager"
        self.receive = r.message(self.mod, "Receive: obj=")
        self.finish = r.message(self.mod, "out=", within=None)
        self.trunc = common.dataclass_to_string_truncated
        self.log = logging.getLogger(self.mod)
        self.skip = {"text", "input_ids", "input_embeds", "image_data", "audio_data", "video_data", "lora_path"}
        self.out_skip = {"text", "output_ids", "embedding"}

    def log_received_request(self, obj: Any) -> None:
        self.log.info(self.receive(obj=obj, dataclass_to_string_truncated=self.trunc, max_length=1 << 30,
                                   skip_names=self.skip))

    def log_finished_request(self, obj: Any, out: Any) -> None:
        self.log.info(self.finish(obj=obj, out=out, dataclass_to_string_truncated=self.trunc,
                                  max_length=1 << 30, skip_names=self.skip, out_skip_names=self.out_skip))


