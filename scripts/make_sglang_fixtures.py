"""Fixtures printed by SGLang's own code: one small prefill/decode run per release wheel.

    pip install -e ".[fixtures]"    # uvicorn, for its formatters
    python scripts/make_sglang_fixtures.py WHEEL... [--out tests/adapters/releases]

Each wheel (``pip download --no-deps sglang==X``) is run in a subprocess of its own. The run is
scripted (which requests arrive, how long their prompts are, which transfer fails), but
every line is formatted by the release: ``configure_logger``'s format with the scheduler's
DP/TP prefix, ``RequestLogger`` and its log targets (text and JSON), ``GenerateReqInput`` as
a dataclass, ``Req.log_time_stats`` with the release's time-stats class, ``validate_input_length``
and ``set_finish_with_abort``, ``FINISH_ABORT.to_json``, the tokenizer's context-length check
and the HTTP server's error line, the transfer-failure messages with ``KVTransferError``, the
``server_args`` line, the pool line, the batch statistics, and uvicorn's own formatters.

What the script chooses: the values (rids, token counts, times, hosts), and the keys of a
finished request's ``meta_info`` (assembled in the tokenizer manager, too entangled to run).
Each release's folder gets ``SOURCE.json``: the release, the wheel's SHA-256, and for each line
type the source file and line it came from.

The run (``SCENARIO``): a prefill server at TP2 and a decode server at TP2 with DP attention
(DP2: each DP rank its own KV pool), Mooncake, context 1,048,576 tokens, KV pool 681,280:
two requests served, one prompt longer than the pool (``validate_input_length``'s abort: up
to 0.5.21 the prefill still bootstraps and sends its one-token stub, from 0.5.22 it is
retired before the handoff), one longer than the context (the tokenizer's rejection on both
servers), and one whose KV transfer fails.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import io
import json
import logging
import os
import random
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sglang_release import Release  # noqa: E402

EPOCH = dt.datetime(2026, 11, 2, 8, 0, 0, tzinfo=dt.UTC).timestamp()
PERF0 = 5000.0  # the schedulers' perf_counter at EPOCH
CONTEXT = 1_048_576
POOL = 681_280  # the prefill pool, tokens
MAX_REQ_INPUT_LEN = POOL - 2  # what the prefill scheduler admits (validate_input_length's limit)
DECODE_POOL = 1_114_112  # the decode pool (each DP rank's): a 700,000-token prompt fits
PAGE = 64
HOSTS = {"prefill": "10.0.0.11", "decode": "10.0.0.21"}
PORTS = {"prefill": 30000, "decode": 30001}
BOOTSTRAP_PORT = 8998

#: (rid, prompt tokens, output tokens, what happens, decode DP rank, arrival seconds after EPOCH)
SCENARIO = [
    ("req-a1", 1200, 64, "served", 0, 2.0),
    ("req-a2", 30500, 128, "served", 1, 3.5),
    ("req-long", 700_000, 32, "over_pool", 0, 6.0),
    ("req-huge", 1_200_000, 16, "over_context", 1, 8.0),
    ("req-fail", 4096, 32, "transfer_failed", 1, 10.0),
    ("req-room", 2048, 16, "room_mismatch", 0, 12.0),  # releases that check it (0.5.11 on)
    ("req-sum", 2048, 16, "checksum_mismatch", 1, 14.0),  # releases with --disaggregation-enable-kv-checksum
    ("req-a3", 900, 8, "served", 0, 16.0),
]


class Clock:
    """The run's clock: logging's ``time.time``, the schedulers' ``perf_counter``."""

    def __init__(self) -> None:
        self.now = EPOCH

    def at(self, seconds: float) -> None:
        self.now = EPOCH + seconds

    def perf(self) -> float:
        return self.now - EPOCH + PERF0


CLOCK = Clock()


def _patch_logging_clock() -> None:
    fake = types.SimpleNamespace(**{k: getattr(time, k) for k in dir(time) if not k.startswith("_")})
    fake.time = lambda: CLOCK.now
    fake.time_ns = lambda: int(CLOCK.now * 1e9)
    fake.perf_counter = CLOCK.perf
    logging.time = fake  # type: ignore[attr-defined]  # (LogRecord reads logging's ``time``)


class Server:
    """One SGLang server (prefill or decode) of one release, logging to ``out`` (its stdout)."""

    def __init__(self, release: Release, role: str, form: str, target: Path | None):
        self.r, self.role, self.form = release, role, form
        self.out = io.StringIO()
        self.sources: dict[str, str] = {}
        self.common = self._common()
        self.process = None  # the process whose logger is configured (tokenizer or a scheduler prefix)
        self.server_args = types.SimpleNamespace(log_level="info")
        self.target = target
        self.dp = role == "decode"
        self.tp_size = 2

    # -- what the release's code is --------------------------------------------------------

    def note(self, kind: str, module: str, marker: str, line: int | None = None) -> None:
        """Record where a line type comes from: file and line in this release."""
        with contextlib.suppress(LookupError, FileNotFoundError):
            self.sources.setdefault(kind, f"{self.r.path_of(module)}:{line or self.r.line_of(module, marker)}")

    def _common(self) -> types.ModuleType:
        mod = "sglang.srt.utils.common" if self.r.has("sglang.srt.utils.common") else "sglang.srt.utils"
        envs = types.SimpleNamespace(SGLANG_LOG_MS=types.SimpleNamespace(get=lambda: False))
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
        """The scheduler processes that log a request's lines: both TP ranks on prefill; on
        decode with DP attention the one DP rank serving it (one TP rank each)."""
        if self.role == "decode":
            return [self.prefix(dp_rank or 0, dp_rank or 0)]
        return [self.prefix(tp, None) for tp in range(self.tp_size)]


def run(release: Release, out: Path) -> None:
    """The scenario through one release: writes the fixture folder ``out/<version>``."""
    _patch_logging_clock()
    os.environ["TZ"] = "UTC"
    time.tzset()
    folder = out / release.version
    folder.mkdir(parents=True, exist_ok=True)
    sources: dict[str, str] = {}
    forms = ("text", "json") if release.has("sglang.srt.utils.request_logger") else ("text",)
    for form in forms:
        for role in ("prefill", "decode"):
            # --log-requests-target: a folder named after the server, beside its stdout capture
            target = folder / form / f"{role}-0" if form == "json" and _has_targets(release) else None
            server = Server(release, role, form, target)
            Scenario(server).play()
            (folder / form).mkdir(parents=True, exist_ok=True)
            (folder / form / f"{role}-0.log").write_text(server.out.getvalue(), encoding="utf-8")
            sources.update(server.sources)
    (folder / "SOURCE.json").write_text(json.dumps({
        "release": release.version, "wheel": release.wheel.name, "sha256": release.sha256,
        "made_by": "scripts/make_sglang_fixtures.py", "context_length": CONTEXT,
        "pool_tokens": {"prefill": POOL, "decode": DECODE_POOL},
        "max_req_input_len": MAX_REQ_INPUT_LEN, "page_size": PAGE,
        "retires_rejected_at_intake": retires(release),
        "scenario": [dict(zip(("rid", "prompt_tokens", "output_tokens", "outcome", "decode_dp_rank", "at_s"), s,
                              strict=True)) for s in SCENARIO],
        "sources": dict(sorted(sources.items())),
    }, indent=2) + "\n", encoding="utf-8")


def _has_targets(release: Release) -> bool:
    return release.has("sglang.srt.utils.log_utils")


class Scenario:
    """The scripted run on one server: start-up, requests, noise."""

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
        if _has_targets(r):
            real["sglang.srt.utils.log_utils"] = None
        envs = types.SimpleNamespace(
            SGLANG_LOG_REQUEST_EXCEEDED_MS=types.SimpleNamespace(get=lambda: 0),
            SGLANG_LOG_REQUEST_HEADERS=types.SimpleNamespace(get=lambda: []),
        )
        values = {"envs": envs, "get_context": lambda: types.SimpleNamespace(
            is_config_namespace_published=lambda ns: False)}
        m = r.module("sglang.srt.utils.request_logger", real=real, values=values)
        if _has_targets(r):
            lu = sys.modules["sglang.srt.utils.log_utils"]
            lu.datetime = _FakeDatetime  # log_json's timestamp
            lu.dist = types.SimpleNamespace(is_initialized=lambda: True, get_rank=lambda: 0)
            lu.socket = types.SimpleNamespace(gethostname=lambda: HOSTS[self.s.role].replace(".", "-"))
            self.s.note("request_target", "sglang.srt.utils.log_utils", "def _create_logger_with_handler")
        else:
            m.datetime = _FakeDatetime
            m._json_handler.setStream(self.s.out)
        if hasattr(m, "redact_watermark_secrets"):
            m.redact_watermark_secrets = lambda data, **_: data
        self.s.note("request_text", "sglang.srt.utils.request_logger", "Receive: obj=")
        self.s.note("request_json", "sglang.srt.utils.request_logger", '"request.received"')
        target = [str(self.s.target)] if self.s.target is not None else None
        kwargs: dict[str, Any] = {"log_requests": True, "log_requests_level": 1,
                                  "log_requests_format": self.s.form}
        import inspect
        if "log_requests_target" in inspect.signature(m.RequestLogger.__init__).parameters:
            kwargs["log_requests_target"] = target
        logger = m.RequestLogger(**kwargs)
        for t in getattr(logger, "targets", []):
            for h in t.handlers:
                if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler):
                    h.setStream(self.s.out)
        return logger

    def _time_stats(self) -> Any:
        r = self.r
        real = {"sglang.srt.disaggregation.utils": ["DisaggregationMode"]}
        if r.has("sglang.srt.observability.req_time_stats"):
            mod, cls = "sglang.srt.observability.req_time_stats", "SchedulerReqTimeStats"
        else:
            mod, cls = "sglang.srt.metrics.collector", "TimeStats"
        m = r.module(mod, real=real)
        m.global_diff_realtime_monotonic = EPOCH - PERF0
        self.dm = sys.modules["sglang.srt.disaggregation.utils"].DisaggregationMode
        self.s.note("time_stats", "sglang.srt.managers.schedule_batch", "def log_time_stats")
        return getattr(m, cls)

    def _io_struct(self) -> types.ModuleType:
        import ast
        tree = ast.parse(self.r.source("sglang.srt.managers.io_struct"))
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

    # -- the run ---------------------------------------------------------------------------

    def play(self) -> None:
        s = self.s
        CLOCK.at(0.0)
        s.configure("")
        self._server_args()
        for prefix in s.schedulers(0) + (s.schedulers(1) if s.role == "decode" else []):
            s.configure(prefix)
            if s.role == "prefill" and prefix.endswith("TP1"):
                continue  # (the pool line is printed by TP rank 0 only)
            self._pool_line()
            self._pool_warning()
        self._uvicorn_startup()
        for rid, prompt, output, outcome, dp_rank, at in SCENARIO:
            self._request(rid, prompt, output, outcome, dp_rank, at)
        CLOCK.at(17.0)
        s.configure(s.schedulers(0)[0])
        self._batch_line()

    def _server_args(self) -> None:
        r, s = self.r, self.s
        engine = "sglang.srt.entrypoints.engine"
        fields = _server_args_fields(r)
        values = {**fields, "model_path": "zai-org/GLM-5.3", "served_model_name": "glm-5.3",
                  "context_length": CONTEXT, "page_size": PAGE, "tp_size": 2,
                  "dp_size": 2 if s.role == "decode" else 1,
                  "enable_dp_attention": s.role == "decode",
                  "disaggregation_mode": s.role, "disaggregation_transfer_backend": "mooncake",
                  "disaggregation_bootstrap_port": BOOTSTRAP_PORT, "host": HOSTS[s.role], "port": PORTS[s.role],
                  "log_requests": True, "log_requests_level": 1, "log_requests_format": s.form,
                  "enable_request_time_stats_logging": True}
        values = {k: v for k, v in values.items() if k in fields}
        if "server_args.resolved_dict()" in r.source(engine) or "_server_args_for_logging" in r.source(engine):
            text = r.message(engine, "server_args=")(server_args=_Dict(values), _server_args_for_logging=dict)
        else:
            sa = dataclasses.make_dataclass("ServerArgs", list(values))(**values)
            text = r.message(engine, "server_args=")(server_args=sa)
        s.note("server_args", engine, "server_args=")
        logging.getLogger("sglang.srt.entrypoints.engine").info(text)

    def _pool_line(self) -> None:
        mod = "sglang.srt.managers.scheduler"
        pool = POOL if self.s.role == "prefill" else DECODE_POOL
        text = self.r.message(mod, "max_total_num_tokens=")(
            max_total_num_tokens=pool, chunked_prefill_size=8192, max_prefill_tokens=16384,
            max_running_requests=48, context_len=CONTEXT, device="cuda", avail_mem=21.37,
            startup_available_gpu_memory_gb=21.37)
        self.s.note("pool", mod, "max_total_num_tokens=")
        self.log.info(text)

    def _batch_line(self) -> None:
        """The head of a batch-statistics line (the rest is assembled piecemeal): noise."""
        marker = "Prefill batch" if self.s.role == "prefill" else "Decode batch"
        mod = next(m for m in ("sglang.srt.managers.scheduler_components.metrics_reporter",
                               "sglang.srt.observability.scheduler_metrics_mixin",
                               "sglang.srt.managers.scheduler_metrics_mixin") if self.r.has(m)
                   and marker in self.r.source(m))
        text = self.r.message(mod, marker)(
            iter_msg="", can_run_list=[1], log_input_tokens=900, log_hit_tokens=0,
            token_usage_msg="token usage: 0.00, ",
            running_bs=1, waiting_queue=[], num_running_reqs=1, num_used=900, token_usage=0.0, cuda_graph=True,
            can_run_cuda_graph=True, new_token_ratio=0.7, last_gen_throughput=41.2, gen_throughput=41.2,
            batch=types.SimpleNamespace(reqs=[1]), num_batch_reqs=1, num_new_seqs=1, new_token=900, cached_token=0,
            num_new_seq=1, num_cached_tokens=0, num_new_tokens=900, num_queue_reqs=0, num_pending_tokens=0,
            num_running_req=1)
        self.s.note("batch_stats", mod, marker)
        self.log.info(text)

    def _pool_warning(self) -> None:
        """0.5.23 on: the warning that the pool cannot hold one full-context request."""
        mod = "sglang.srt.managers.tp_worker"
        if not self.r.has(mod) or "fewer than --context-length" not in self.r.source(mod):
            return
        if self.s.role == "decode":  # (its pool holds a full-context request)
            return
        text = self.r.percent_message(mod, "fewer than --context-length")(kv_capacity=POOL, context_len=CONTEXT)
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
        err.info("Uvicorn running on %s://%s:%d (Press CTRL+C to quit)", "http", HOSTS[self.s.role], PORTS[self.s.role])
        self.access = logging.getLogger("uvicorn.access")

    def _access(self, status: int) -> None:
        self.access.info('%s - "%s %s HTTP/%s" %d', "10.0.0.2:51822", "POST", "/generate", "1.1", status)

    def _request(self, rid: str, prompt: int, output: int, outcome: str, dp_rank: int, at: float) -> None:
        s, r = self.s, self.r
        room = 9_000_000_000 + sum(map(ord, rid)) * 7919
        CLOCK.at(at)
        s.configure("")
        obj = self._obj(rid, prompt, output, room)
        self._objs[rid] = obj
        if outcome == "over_context":  # logged on arrival, then refused by the tokenizer: no finish line
            self.request_logger.log_received_request(obj)
            CLOCK.at(at + 0.003)
            mod = "sglang.srt.managers.tokenizer_manager"
            render, at_line = _raised(r, mod, "is longer than the ")
            msg = render(input_token_num=prompt, context_len=CONTEXT)
            s.note("context_rejection", mod, "is longer than the ", at_line)
            http = "sglang.srt.entrypoints.http_server"
            within = "serve_generate_request" if "def serve_generate_request" in r.source(http) else "generate_request"
            render, at_line = r.message(http, "Error: ", within=within), None
            line = render(e=msg)
            s.note("http_error", http, "Error: ")
            self.http_log.error(line)
            self._access(400)
            return
        self.request_logger.log_received_request(obj)
        CLOCK.at(at + 0.01)
        ts = self.time_stats(disagg_mode=self.dm.PREFILL if s.role == "prefill" else self.dm.DECODE)
        req = types.SimpleNamespace(rid=rid, bootstrap_room=room, origin_input_ids=[0] * prompt, output_ids=[],
                                    cached_tokens=0, prefill_attempt_count=1, time_stats=ts,
                                    has_log_time_stats=False, multimodal_inputs=None, grammar=None,
                                    return_logprob=False, logprob_start_len=-1, to_finish=None,
                                    release_mm_inputs_on_abort=lambda: None)
        aborted: dict[str, Any] | None = None
        schedulers = s.schedulers(dp_rank)
        t = at + 0.01
        if s.role == "prefill":
            ts.prefill_bootstrap_queue_entry_time = CLOCK.perf()
            if hasattr(ts, "bootstrap_done_time"):
                ts.bootstrap_done_time = CLOCK.perf() + 0.004
            if outcome == "over_pool":
                aborted = self._validate(req, schedulers)
                if retires(r):  # retired at the bootstrap queue: never prefilled nor sent
                    self._finish(obj, rid, 1, 0, aborted, at + 0.05)
                    return
            t += 0.005
            ts.wait_queue_entry_time = EPOCH - EPOCH + PERF0 + t
            ts.forward_entry_time = PERF0 + t + 0.002
            t += 0.002 + (0.001 if aborted else prompt / 200_000)
            ts.completion_time = PERF0 + t
            ts.prefill_transfer_queue_entry_time = PERF0 + t
            if hasattr(ts, "transfer_total_mb"):
                ts.transfer_total_mb = len(req.origin_input_ids) * 0.0625
                ts.transfer_speed_gb_s = 18.4
            req.output_ids = [1]
            if outcome == "transfer_failed":
                CLOCK.at(t + 0.2)
                self._transfer_failed(req, room, schedulers, "prefill")
                self._finish(obj, rid, prompt, 0, self._abort_json(self._last_error, 500), t + 0.21)
                return
            CLOCK.at(t)
            for prefix in schedulers:
                s.configure(prefix)
                req.has_log_time_stats = False
                self._log_time_stats(req)
            s.configure("")
            self._finish(obj, rid, len(req.origin_input_ids), 1, aborted, t + 0.001)
            return
        # decode
        ts.decode_prealloc_queue_entry_time = PERF0 + t
        ts.decode_transfer_queue_entry_time = PERF0 + t + 0.003
        if outcome == "over_pool" and retires(r):
            CLOCK.at(t + 0.3)
            self._transfer_failed(req, room, schedulers, "decode", reason="Prefill bootstrap failed")
            self._finish(obj, rid, prompt, 0, self._abort_json(self._last_error, 500), t + 0.31)
            return
        if outcome == "transfer_failed":
            CLOCK.at(t + 0.25)
            self._transfer_failed(req, room, schedulers, "decode")
            self._finish(obj, rid, prompt, 0, self._abort_json(self._last_error, 500), t + 0.26)
            return
        if outcome in ("room_mismatch", "checksum_mismatch") and self._integrity(req, room, outcome, schedulers, t):
            return
        t += 0.003 + prompt / 400_000 + 0.02
        ts.wait_queue_entry_time = PERF0 + t
        ts.forward_entry_time = PERF0 + t + 0.001
        t += 0.001 + output * 0.012
        ts.completion_time = PERF0 + t
        req.output_ids = [1] * output
        CLOCK.at(t)
        for prefix in schedulers:
            s.configure(prefix)
            self._log_time_stats(req)
        s.configure("")
        self._finish(obj, rid, prompt, output, None, t + 0.002)

    def _integrity(self, req: Any, room: int, outcome: str, schedulers: list[str], t: float) -> bool:
        """A decode-side integrity check that fails, where the release has it; False where not
        (the request is then served as any other)."""
        mod = "sglang.srt.disaggregation.decode"
        src = self.r.source(mod)
        if outcome == "room_mismatch":
            if "Context corruption detected" not in src:
                return False
            first = self.r.message(mod, "Context corruption detected")
            line = first(rid=req.rid, expected_room=room, actual_room=room + 1, idx=3)
            abort = "Metadata corruption detected - bootstrap_room mismatch"
            self.s.note("room_mismatch", mod, "Context corruption detected")
        else:
            if "KV checksum mismatch req=" not in src:
                return False
            line = self.r.message(mod, "KV checksum mismatch req=")(
                rid=req.rid, bootstrap_room=room, expected=0x5A17C0DE, actual=0x5A17C0DF)
            abort = "KV checksum mismatch"
            self.s.note("checksum_mismatch", mod, "KV checksum mismatch req=")
        CLOCK.at(t + 0.05)
        for prefix in schedulers:
            self.s.configure(prefix)
            logging.getLogger(mod).error(line)
        self._finish(self._obj_of(req), req.rid, len(req.origin_input_ids), 0, self._abort_json(abort, 500), t + 0.06)
        return True

    def _obj(self, rid: str, prompt: int, output: int, room: int) -> Any:
        cls = self.io.GenerateReqInput
        fields = {f.name for f in dataclasses.fields(cls)}
        kwargs = {"rid": rid, "input_ids": [1] * 8, "sampling_params": {"max_new_tokens": output, "temperature": 0.0},
                  "stream": False, "bootstrap_host": HOSTS["prefill"], "bootstrap_port": BOOTSTRAP_PORT,
                  "bootstrap_room": room}
        obj = cls(**{k: v for k, v in kwargs.items() if k in fields})
        with contextlib.suppress(Exception):
            obj.normalize_batch_and_arguments()
        return obj

    def _log_time_stats(self, req: Any) -> None:
        fn = self.r.method("sglang.srt.managers.schedule_batch", "Req", "log_time_stats", {"logger": self.log})
        req.has_log_time_stats = False
        fn(req)

    def _validate(self, req: Any, schedulers: list[str]) -> dict[str, Any]:
        mod = "sglang.srt.managers.utils"
        utils = self.r.module(mod, ["validate_input_length"])
        error = utils.validate_input_length(req, MAX_REQ_INPUT_LEN, False)
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

    def _transfer_failed(self, req: Any, room: int, schedulers: list[str], side: str,
                         reason: str = "Failed to get kvcache from prefill instance, it might be dead") -> None:
        r = self.r
        conn = next(m for m in ("sglang.srt.disaggregation.common.conn", "sglang.srt.disaggregation.mooncake.conn",
                                "sglang.srt.disaggregation.common.utils") if r.has(m)
                    and "class KVTransferError" in r.source(m))
        kv_error = r.module(conn, ["KVTransferError"]).KVTransferError
        mod = f"sglang.srt.disaggregation.{side}"
        # where the release marks errors propagated from another rank, only the first logs at
        # warning/error (the rest at debug, not printed); before, every rank logs its own
        muted = "is_from_another_rank" in r.source(mod)
        marker = "Prefill transfer failed" if side == "prefill" else "Decode transfer failed"
        head = r.message(mod, marker)
        tail = r.message(mod, " with exception ")
        self.s.note(f"{side}_transfer_failed", mod, marker)
        log = logging.getLogger(f"sglang.srt.disaggregation.{side}")
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
                (log.warning if side == "prefill" else log.error)(message)

    def _abort_json(self, message: str, status: int) -> dict[str, Any]:
        return self.finish.FINISH_ABORT(message, _HTTPStatus(status)).to_json()

    def _finish(self, obj: Any, rid: str, prompt: int, output: int, aborted: dict[str, Any] | None, at: float) -> None:
        CLOCK.at(at)
        self.s.configure("")
        reason = aborted or self.finish.FINISH_LENGTH(length=output).to_json()
        out = {"text": "", "output_ids": [1] * output, "meta_info": {
            "id": rid, "finish_reason": reason, "prompt_tokens": prompt, "completion_tokens": output,
            "cached_tokens": 0, "e2e_latency": 0.5}}
        self.request_logger.log_finished_request(obj, out)
        status = 200 if aborted is None else int(aborted.get("status_code") or 500)
        self._access(status)


def retires(r: Release) -> bool:
    """Whether the release retires a request rejected at intake before the prefill handoff
    (``PrefillBootstrapQueue.add`` calling ``retire_unadmitted_request``), rather than
    bootstrapping it and sending its one-token stub."""
    return "retire_unadmitted_request" in r.source("sglang.srt.disaggregation.prefill")


def _tp_of(prefix: str) -> int:
    """The TP rank a scheduler's prefix names (0 where it names none)."""
    return int(prefix.rsplit("TP", 1)[-1]) if "TP" in prefix else 0


def _raised(r: Release, module: str, marker: str) -> tuple[Any, int]:
    """The message of the ``raise ValueError(...)`` holding ``marker`` (not the warning beside
    it), and its line."""
    import ast
    tree = ast.parse(r.source(module))
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and marker in ast.unparse(node.exc):
            return r.message_of(module, node.exc.args[0]), node.lineno
    raise LookupError(f"no raise with {marker!r} in {module} of {r.version}")


def _server_args_fields(r: Release) -> dict[str, Any]:
    """ServerArgs' fields in the release's order, with their defaults where they are literals."""
    import ast
    tree = ast.parse(r.source("sglang.srt.server_args"))
    classes = [next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ServerArgs")]
    if not any(isinstance(i, ast.AnnAssign) for i in classes[0].body):  # (0.5.23: fields in namespaces)
        folder = "sglang/srt/arg_groups/fields/"
        for path in sorted(p for p in r._zip.namelist() if p.startswith(folder) and p.endswith(".py")):
            module = path[:-3].replace("/", ".")
            classes += [n for n in ast.parse(r.source(module)).body if isinstance(n, ast.ClassDef)]
    out: dict[str, Any] = {}
    for item in (i for c in classes for i in c.body):
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            try:
                out[item.target.id] = ast.literal_eval(item.value) if item.value is not None else None
            except ValueError:
                out[item.target.id] = None
    return out


class _Dict(dict):  # type: ignore[type-arg]
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
    def now(cls, tz: Any = None) -> Any:  # type: ignore[override]
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


def vary(seed: int) -> None:
    """Another run of the same shape: request ids, prompt and output lengths, DP ranks and
    arrival times drawn from ``seed`` (each outcome keeps a prompt length that gives it)."""
    rng = random.Random(seed)
    at, out = 2.0, []
    for rid, prompt, output, outcome, _, _ in SCENARIO:
        if outcome == "over_pool":
            prompt = rng.randrange(MAX_REQ_INPUT_LEN + 1, min(CONTEXT, DECODE_POOL) - 1)
        elif outcome == "over_context":
            prompt = rng.randrange(CONTEXT, 2 * CONTEXT)
        else:
            prompt = rng.randrange(16, 60_000)
        output = rng.randrange(1, 200)
        out.append((f"{rid}-{rng.randrange(16**6):06x}", prompt, output, outcome, rng.randrange(2), round(at, 3)))
        at += 0.05 + prompt / 400_000 + output * 0.012 + rng.uniform(0.5, 1.5)
    SCENARIO[:] = out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("wheels", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=Path("tests/adapters/releases"))
    parser.add_argument("--seed", type=int, help="another run of the same shape (scripts/check_sglang_releases.py)")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.seed is not None:
        vary(args.seed)
    if args.one:
        run(Release(args.wheels[0]), args.out)
        return 0
    seed = ["--seed", str(args.seed)] if args.seed is not None else []
    for wheel in args.wheels:
        done = subprocess.run([sys.executable, __file__, "--one", "--out", str(args.out), *seed, str(wheel)],
                              check=False)
        print(f"{wheel.name}: {'ok' if done.returncode == 0 else 'FAILED'}")
        if done.returncode:
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
