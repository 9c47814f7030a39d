"""`python -m signaling`: run the agent's HTTP signaling server."""

from __future__ import annotations

import argparse
import asyncio
import errno
import ipaddress
import logging
import os
import signal
import socket
import ssl
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import aiohttp
from aiohttp import web
from aiohttp.web_runner import GracefulExit

from agent import worker_tag
from agent.call_settings import CallSettings
from agent.cli_errors import exit_with_error, program_name
from agent.errors import AgentError
from agent.logs import json_log
from agent.logs.redact import RedactingFilter
from agent.media_agent import AgentSettings, MediaAgent
from agent.plugins.base import PluginOptions
from agent.plugins.registry import available_plugins, load_plugin, plugin_class
from agent.webrtc.encoding import OPUS_COMPLEXITY, OPUS_COMPLEXITY_RANGE
from signaling import (
    address_limit,
    auth,
    bad_requests,
    call_limit,
    call_webhook,
    cluster,
    cors,
    drain,
    env_flags,
    gc_tuning,
    ice,
    page,
    slow_clients,
    telephony,
)
from signaling.aiohttp_internals import missing_internals as missing_aiohttp_internals
from signaling.app import create_app
from signaling.ice import (
    AUDIO_CODECS,
    PortRange,
    UdpMux,
    host_address_count,
    limit_host_addresses,
    limit_host_ports,
    parse_codec_list,
    ports_needed,
    use_udp_mux,
)
from signaling.plugin_flags import (
    PluginFlagsParser,
    plugin_extra,
    refuse_other_model_flags,
    selected_plugin,
)
from signaling.serving import Listeners, serve
from signaling.sip import config as sip_config
from signaling.sip import service as sip_service
from signaling.workers import channel
from signaling.workers.routing import WorkerGroup
from signaling.workers.supervisor import exit_for_listen_error, run_supervisor

log = logging.getLogger("signaling")


def _codec_list(text: str) -> tuple[str, ...]:
    try:
        return parse_codec_list(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _opus_complexity(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value not in OPUS_COMPLEXITY_RANGE:
        raise argparse.ArgumentTypeError(f"must be a whole number from 0 to 10, not {text!r}")
    return value


def whole_number(minimum: int) -> Callable[[str], int]:
    """A flag type: a whole number of at least `minimum`."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected a whole number of at least {minimum}, "
                                             f"not {text!r}")
        return value
    return parse


def seconds(text: str) -> float:
    """A flag type: seconds, 0 or more."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:  # also NaN
        raise argparse.ArgumentTypeError(f"expected 0 or more seconds, not {text!r}")
    return value


def ip_address(text: str) -> str:
    """A flag type: an IPv4 or IPv6 address, as written."""
    try:
        ipaddress.ip_address(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an IP address, not {text!r}") from None
    return text


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


# Real-time Opus echo calls per core, with room to spare: one core held 80 when quiet and 32
# with a busy loop on the same core (docs/benchmarks.md, capacity, 2026-12-04). A default that
# keeps an unconfigured server from taking calls it cannot serve in real time.
CALLS_PER_CORE = 24


def default_max_sessions() -> int:
    return CALLS_PER_CORE * (os.cpu_count() or 1)


class DefaultsShown(argparse.HelpFormatter):
    """Every flag's help ends with its default, unless the help already says it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if ("default" in text or action.default is None or action.default is False
                or action.default is argparse.SUPPRESS or not action.option_strings):
            return text
        return text + " (default: %(default)s)"


def build_parser() -> PluginFlagsParser:
    parser = PluginFlagsParser(
        prog=program_name("python -m signaling", script="duplex-agent"),
        description="WebRTC realtime media agent for full-duplex speech models. Each plugin "
        "adds its own options: see `--plugin ID --help`.",
        formatter_class=DefaultsShown,
    )
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8080, help="TCP port (default 8080)")
    parser.add_argument(
        "--plugin", default="echo",
        help=f"plugin id (default echo; available: {', '.join(available_plugins())})",
    )
    parser.add_argument(
        "--workers", type=whole_number(1), default=None, metavar="N",
        help="worker processes behind the one port, each with its own event loop; "
        "--max-sessions and the other limits stay the whole server's (default: one per CPU core "
        "for plugins that run one instance per worker — echo, vllm-omni; always 1 for a model "
        "held in this process — "
        "personaplex, moshi — and for moshi-server, whose reference servers hold one call: "
        "scale the models out with more engines behind the remote plugins)")
    parser.add_argument(
        "--nice", type=int, default=0, metavar="N",
        help="scheduling niceness of the server and its workers (default 0: as started); "
        "negative puts its 20 ms audio pacing ahead of other work on the machine (needs root "
        "or CAP_SYS_NICE; refused with a warning otherwise; docs/operations.md)")
    parser.add_argument("--worker-dir", default=None, metavar="DIR",
                        help="folder for the workers' private unix sockets (default: a new "
                        "temporary folder)")
    parser.add_argument("--worker-index", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--worker-fds", default=None, help=argparse.SUPPRESS)
    model = parser.add_argument_group("model plugins")
    model.add_argument("--model-dir", help="checkpoint directory (personaplex, moshi)")
    model.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda")
    model.add_argument("--dtype", default=None, help="float32 or bfloat16 (default by device)")
    model.add_argument("--voice", default=None, help="default voice, e.g. NATF2.pt")
    model.add_argument("--upstream", action="append", default=[],
                       help="remote engine URL (repeatable; vllm-omni, moshi-server)")
    model.add_argument("--model", default=None, help="model name to ask a remote engine for")
    calls = parser.add_argument_group("calls")
    calls.add_argument("--max-sessions", type=whole_number(0), default=None,
                       help="concurrent calls admitted, all transports together (default: "
                       f"{CALLS_PER_CORE} per CPU core = {default_max_sessions()} here, or the "
                       "plugin's own limit when lower; 0 = unlimited)")
    calls.add_argument("--max-call-seconds", type=seconds, default=0.0,
                       help="hard limit on a call's length (0 = none)")
    calls.add_argument("--idle-timeout", type=float, default=15.0,
                       help="end a call whose inbound audio stopped this many seconds ago")
    calls.add_argument("--connect-timeout", type=float, default=20.0,
                       help="end a call not connected (ICE+DTLS) within this many seconds")
    calls.add_argument("--reconnect-seconds", type=sip_config.seconds_between(0.0, 3600.0),
                       default=10.0, metavar="S",
                       help="a WebRTC call whose network path is gone (ICE consent expired, "
                       "or nothing received for 3 s) waits this long for the caller to come "
                       "back or restart ICE before it ends with connection_lost (default 10)")
    calls.add_argument("--jitter-buffer", type=whole_number(0), default=1, metavar="PACKETS",
                       help="receive jitter buffer depth in 20 ms packets before decoding "
                       "(aiortc: 4; default 1; 0 releases each packet on arrival and leaves "
                       "jitter to the caller FIFO after decoding; raise it on links that "
                       "reorder packets)")
    calls.add_argument("--opus-complexity", type=_opus_complexity, default=OPUS_COMPLEXITY,
                       metavar="0-10",
                       help="libopus encoder complexity for the agent's outbound audio "
                       f"(default {OPUS_COMPLEXITY}, libopus's own): lower costs less CPU per "
                       "call at some loss of quality at the same bitrate; 0 encodes about twice "
                       "as fast as 10 (benchmarks/opus_complexity_bench.py prints both)")
    calls.add_argument("--codecs", default=",".join(AUDIO_CODECS), type=_codec_list,
                       help="accepted audio codecs in preference order (default opus,PCMU,PCMA)")
    calls.add_argument("--record-dir", default=None, metavar="DIR",
                       help="record every call to DIR: <call_id>.flac (caller left, agent "
                       "right) and <call_id>.events.jsonl; a call opts out with "
                       "extra_body.record=false; retention is the operator's job (default: off)")
    calls.add_argument("--record-format", choices=("flac", "opus"), default="flac",
                       help="--record-dir files: flac (lossless, <call_id>.flac) or opus "
                       "(Ogg-Opus, about a tenth of the size, <call_id>.ogg)")
    calls.add_argument("--record-max-seconds", type=float, default=3600.0, metavar="S",
                       help="close a call's recording after S seconds of audio; the call goes "
                       "on (default 3600; 0 = no limit)")
    calls.add_argument("--record-min-free-mb", type=float, default=512.0, metavar="MB",
                       help="stop recording (or never start) while the --record-dir file system "
                       "has less than MB free, checked every few seconds; the call goes on "
                       "(default 512; 0 = no floor)")
    calls.add_argument("--max-voice-upload-bytes", type=whole_number(0), default=0,
                       metavar="BYTES",
                       help="take a voice recording uploaded with an offer (multipart field "
                       "'voice_audio', plugins with voice_upload) up to this size; 0 = refuse "
                       "uploads (default). 4000000 holds 60 s of 24 kHz 16-bit mono WAV")
    calls.add_argument("--ice-host", action="append", default=None, metavar="ADDR",
                       type=ip_address,
                       help="gather ICE host candidates only on this address (repeatable; "
                       "default: every interface; 127.0.0.1 keeps calls on loopback)")
    parser.add_argument("--no-metrics", action="store_true",
                        help="serve no GET /metrics and skip its per-tick timing and event-loop "
                        "lag sampling (default: metrics on)")
    parser.add_argument("--log-level", default="INFO", type=str.upper, choices=LOG_LEVELS,
                        help="DEBUG, INFO, WARNING or ERROR (default INFO; debug also shows "
                        "the traceback behind a start-up error)")
    json_log.add_arguments(parser)
    slow = parser.add_argument_group("slow clients")
    header_s, body_s = slow_clients.DEFAULT_HEADER_TIMEOUT, slow_clients.DEFAULT_BODY_TIMEOUT
    slow.add_argument("--header-timeout", type=seconds, default=header_s, metavar="S",
                      help="close a new connection that has not sent a complete request head "
                      f"within S seconds (default {header_s:g}; 0 = none)")
    slow.add_argument("--body-timeout", type=seconds, default=body_s, metavar="S",
                      help="answer 408 and close when a request body has not arrived within S "
                      f"seconds of its head (default {body_s:g}; 0 = none)")
    slow.add_argument("--max-unauthenticated-per-address", type=whole_number(0),
                      default=address_limit.DEFAULT_PER_ADDRESS, metavar="N",
                      help="close a new connection from an address that already holds N "
                      "connections with no authenticated request yet (default "
                      f"{address_limit.DEFAULT_PER_ADDRESS}; 0 = no limit)")
    tls = parser.add_argument_group("TLS (browsers need https to use a microphone off localhost)")
    tls.add_argument("--tls-cert", metavar="FILE", help="PEM certificate chain: serve https")
    tls.add_argument("--tls-key", metavar="FILE", help="PEM private key for --tls-cert")
    drain.add_arguments(calls)
    auth.add_arguments(parser)
    telephony.add_arguments(parser)
    sip_config.add_arguments(parser)
    call_webhook.add_arguments(parser)
    ice.add_arguments(parser)
    cors.add_arguments(parser)
    page.add_arguments(parser)
    cluster.add_arguments(parser)  # --cluster: many hosts (signaling/cluster/)
    return parser


def settings_from_args(args: argparse.Namespace, workers: int = 1) -> AgentSettings:
    total_calls = default_max_sessions() if args.max_sessions is None else args.max_sessions
    return AgentSettings(
        ice_servers=ice.ice_servers_from_args(args),
        rtc_ports=ice.rtc_ports_from_args(args),
        rtc_advertise=ice.rtc_advertise_from_args(args),
        rtc_udp_port=ice.rtc_udp_port_from_args(args),
        reconnect_seconds=args.reconnect_seconds,
        jitter_prefetch_packets=max(0, args.jitter_buffer),
        codecs=tuple(args.codecs),
        opus_complexity=args.opus_complexity,
        # Every worker may hold up to the limit; with several, they count their calls
        # together (workers/limits.py), so the server as a whole admits --max-sessions.
        max_calls=total_calls,
        call=CallSettings(
            idle_timeout=args.idle_timeout,
            connect_timeout=args.connect_timeout,
            max_call_seconds=args.max_call_seconds,
            record_dir=args.record_dir,
            record_format=args.record_format,
            record_max_seconds=args.record_max_seconds,
            record_min_free_mb=args.record_min_free_mb,
        ),
    )


def tls_context_from_args(args: argparse.Namespace) -> ssl.SSLContext | None:
    """An https server context from --tls-cert/--tls-key; ValueError says what is wrong."""
    if not args.tls_cert and not args.tls_key:
        return None
    if not (args.tls_cert and args.tls_key):
        raise ValueError("--tls-cert and --tls-key go together")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(args.tls_cert, args.tls_key)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"cannot load {args.tls_cert} / {args.tls_key}: {exc}") from None
    return context


def check_rtc_flags(args: argparse.Namespace) -> PortRange | None:
    """`--rtc-ports` and `--rtc-advertise` checked before anything starts (exits 2 with one
    coded line); the range, which the caller applies where the calls run."""
    try:
        ice.rtc_advertise_from_args(args)
    except ValueError as exc:
        exit_with_error("rtc_advertise_invalid", f"--rtc-advertise {exc}")
    try:
        ice.rtc_udp_port_from_args(args)
    except ValueError as exc:
        exit_with_error("rtc_udp_port_invalid", f"--rtc-udp-port {exc}")
    try:
        ports = ice.rtc_ports_from_args(args)
    except ValueError as exc:
        exit_with_error("rtc_ports_invalid", f"--rtc-ports {exc}")
    if ports is None:
        return None
    if args.ice_host:
        limit_host_addresses(args.ice_host)
    addresses = host_address_count()
    calls = default_max_sessions() if args.max_sessions is None else args.max_sessions
    needed = ports_needed(calls, addresses)
    if calls and ports.size < needed:
        exit_with_error("rtc_ports_too_few",
                        f"--rtc-ports {ports} holds {ports.size} ports; {calls} calls "
                        f"(--max-sessions) on {addresses} host address(es) need {needed} "
                        "(one per address per call): widen the range, lower --max-sessions "
                        "or gather on fewer addresses (--ice-host)")
    return ports


def check_record_dir(record_dir: str | None) -> None:
    """`--record-dir` made if missing and writable, or one coded line (not a failed
    recording on every call later)."""
    if not record_dir:
        return
    folder = os.path.expanduser(record_dir)
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        exit_with_error("record_dir_unwritable", f"--record-dir {record_dir}: "
                        f"{exc.strerror or exc}")
    if not os.access(folder, os.W_OK | os.X_OK):
        exit_with_error("record_dir_unwritable", f"--record-dir {record_dir}: cannot write "
                        "there")


def open_udp_mux(args: argparse.Namespace, workers: int) -> None:
    """`--rtc-udp-port`: bind the one port on every host address now (in use: a start-up
    error, not a failed call later) and put every call's host candidates on it."""
    port = ice.rtc_udp_port_from_args(args)  # checked by check_rtc_flags
    if port is None:
        return
    if workers > 1:
        exit_with_error("rtc_udp_port_workers", f"--rtc-udp-port needs --workers 1 (one "
                        f"process owns the port and every call on it), not {workers}")
    if args.ice_host:
        limit_host_addresses(args.ice_host)
    try:
        mux = UdpMux.open_on_host_addresses(port)
    except OSError as exc:
        code = "rtc_udp_port_in_use" if exc.errno == errno.EADDRINUSE else (
            "rtc_udp_port_unavailable")
        exit_with_error(code, f"--rtc-udp-port cannot bind {exc.strerror}")
    if not use_udp_mux(mux):
        exit_with_error("rtc_udp_port_unsupported", "--rtc-udp-port: the installed aioice no "
                        "longer binds host candidates where agent/rtc_tuning/udp_mux.py expects")
    log.info("every call's ICE, DTLS and SRTP on UDP port %d of %s", mux.port,
             ", ".join(mux.sockets) or "no address")


def plugin_options_from_args(args: argparse.Namespace) -> PluginOptions:
    return PluginOptions(
        model_dir=args.model_dir, device=args.device, dtype=args.dtype,
        max_sessions=args.max_sessions or 0, voice=args.voice,
        upstreams=tuple(args.upstream), model=args.model,
        extra=plugin_extra(args),
    )


def worker_count(args: argparse.Namespace) -> int:
    """How many workers to run: as asked, or one per core, where the plugin allows it."""
    if not plugin_class(args.plugin).runs_per_worker:
        if args.workers is not None and args.workers > 1:
            log.warning("plugin %s keeps every call in one process (one batched step serves "
                        "them all): --workers %d is ignored", args.plugin, args.workers)
        return 1
    if args.workers is None:
        return os.cpu_count() or 1
    return max(1, args.workers)


def apply_niceness(niceness: int) -> None:
    """Set the niceness before any thread or worker starts: Linux keeps it per thread, and
    threads and child processes inherit it from their creator."""
    if niceness == 0:
        return
    try:
        os.setpriority(os.PRIO_PROCESS, 0, niceness)
    except PermissionError:
        log.warning("--nice %d: not permitted (needs root or CAP_SYS_NICE); running at %d",
                    niceness, os.getpriority(os.PRIO_PROCESS, 0))
    else:
        log.info("running at niceness %d", niceness)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line, with every long flag also read from `AGENT_<FLAG>` variables
    (signaling/env_flags.py); the command line wins."""
    parser = build_parser()
    given = list(sys.argv[1:] if argv is None else argv)
    try:
        # The plugin may come from AGENT_PLUGIN; its own flags can then be set the same way.
        plugin = selected_plugin(env_flags.with_environment(parser, given, os.environ))
        parser.add_plugin_flags(plugin)
        from_env = env_flags.environment_argv(parser, given, os.environ)
    except env_flags.EnvFlagError as exc:
        exit_with_error(exc.code, exc.message)
    flags = {word.split("=", 1)[0] for word in from_env if word.startswith("--")}
    parser.set_by = {flag: env_flags.variable_name(flag) for flag in flags}
    return parser.parse_args(from_env + given)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    worker = "" if args.worker_index is None else f" w{args.worker_index}"
    logging.basicConfig(
        level=args.log_level.upper(),
        format=f"%(asctime)s %(levelname)s{worker} %(name)s: %(message)s",
    )
    # Every line goes through redaction: upstream URLs carry credentials, and request lines
    # carry media-stream keys (`?token=KEY` or a last path segment).
    media_stream_path = "/" + args.media_stream_path.lstrip("/")
    for handler in logging.getLogger().handlers:
        handler.addFilter(RedactingFilter([media_stream_path]))
    if args.log_format == "json":
        json_log.use_json(worker=args.worker_index)
    bad_requests.install()  # a client's malformed HTTP: one INFO line a second, no traceback
    missing = missing_aiohttp_internals()  # an aiohttp upgrade: one line, not a later failure
    if missing:
        exit_with_error("aiohttp_unsupported", f"aiohttp {aiohttp.__version__} lacks what "
                        f"signaling/aiohttp_internals.py uses: {', '.join(missing)}")
    # aioice logs every candidate pair check at INFO: one line per call is enough here.
    logging.getLogger("aioice").setLevel(max(logging.WARNING, logging.getLogger().level))
    try:  # an unknown plugin is one line, like every other start-up mistake
        refuse_other_model_flags(build_parser(), args, plugin_class(args.plugin))
    except AgentError as exc:
        exit_with_error(exc.code, exc.message, cause=exc)
    if args.worker_index is None:  # workers inherit it from the supervisor
        apply_niceness(args.nice)
    workers = worker_count(args)
    group = None
    if args.worker_index is not None:
        worker_tag.set_worker(args.worker_index)
        secret = os.environ.pop(channel.SECRET_ENV, None)
        if secret is None or args.worker_dir is None or args.worker_fds is None:
            exit_with_error("not_a_worker", "--worker-index is set by the supervisor "
                            "(--workers N), not by hand")
        group = WorkerGroup(args.worker_index, workers, Path(args.worker_dir), secret.encode())
    # Checked here, before any worker starts, so a mistake is one line from this process.
    try:
        ssl_context = tls_context_from_args(args)
    except ValueError as exc:
        exit_with_error("tls_invalid", f"tls: {exc}", cause=exc)
    rtc_ports = check_rtc_flags(args)
    check_record_dir(args.record_dir)
    webhook = call_webhook.settings_from_args(args)  # before any worker starts
    open_udp_mux(args, workers)
    try:
        plugin = load_plugin(args.plugin, plugin_options_from_args(args))
    except AgentError as exc:
        exit_with_error(exc.code, exc.message, cause=exc)
    # --cluster: the node's tag claimed before any worker starts (they inherit it)
    cluster_settings = cluster.prepare(args)
    if workers > 1 and group is None:
        return run_supervisor(list(argv) if argv is not None else sys.argv[1:], workers,
                              args.host, args.port, args.worker_dir)
    if args.ice_host:
        limit_host_addresses(args.ice_host)
    if rtc_ports is not None and not limit_host_ports(rtc_ports):
        exit_with_error("rtc_ports_unsupported", "--rtc-ports: the installed aioice no longer "
                        "binds host candidates where agent/rtc_tuning/port_range.py expects")
    agent = MediaAgent(plugin, settings_from_args(args, workers))
    auth_settings = auth.settings_from_args(args)
    app = create_app(agent, auth=auth_settings, cors_origins=cors.origins_from_args(args),
                     telephony_config=telephony.config_from_args(args),
                     body_timeout=args.body_timeout, drain_seconds=args.drain_seconds,
                     metrics_enabled=not args.no_metrics,
                     voice_upload_bytes=args.max_voice_upload_bytes, workers=group,
                     token_url_origins=page.origins_from_args(args))
    sip_service.install_from_args(app, args)  # --sip-listen: the SIP user agent (docs/sip.md)
    if cluster_settings is None:  # (a cluster counts every key's calls in Redis instead)
        call_limit.install_key_limit(app, args.max_calls_per_key)
    if webhook is not None:  # --webhook-url: realtime.call.ended for every call
        call_webhook.install(app, call_webhook.CallEndedWebhook(*webhook))
    if cluster_settings is not None:
        cluster.install(app, cluster_settings, workers)
    app.on_startup.append(_drain_on_sigterm)
    app.on_startup.append(gc_tuning.freeze_after_startup)  # after the plugin loaded
    scheme = "https" if ssl_context else "http"

    of_workers = "" if group is None else f" (worker {group.index} of {group.count})"

    def listening() -> None:
        # Once serving: a start-up mistake (a model that cannot load) is the only line then.
        log_auth(args.host, auth_settings)
        log.info("serving plugin %s on %s://%s:%d%s", plugin.id, scheme, args.host, args.port,
                 of_workers)

    # A worker accepts on the supervisor's listening sockets (with the server's TLS), and on
    # its own unix socket (without) where the other workers forward what it owns.
    listeners = Listeners(args.host, args.port)
    if group is not None:
        listeners = Listeners(
            args.host, args.port,
            sockets=[socket.socket(fileno=int(fd)) for fd in args.worker_fds.split(",")],
            private_path=str(group.socket_path(group.index)))
    try:
        serve(app, listeners, ssl_context, on_listening=listening,
              loop=slow_clients.guarded_event_loop(args.header_timeout,
                                                  args.max_unauthenticated_per_address))
    except AgentError as exc:  # the plugin loads its model at start-up: bad dir, voice, ...
        exit_with_error(exc.code, exc.message, cause=exc)
    except OSError as exc:
        exit_for_listen_error(exc, args.host, args.port)
    log.info("stopped")
    return 0


def log_auth(host: str, settings: auth.AuthSettings) -> None:
    """Whether requests need a key: a warning for an open server."""
    if not settings.open:
        log.info("API key required (%d key(s)); ephemeral secrets last %g s by default",
                 len(settings.api_keys), settings.secret_ttl_seconds)
    elif host in ("127.0.0.1", "localhost", "::1"):
        log.warning("no --api-key: the server is open to anyone who can reach %s "
                    "(loopback only)", host)
    else:
        log.warning("no --api-key: listening on %s WITHOUT authentication", host)


async def _drain_on_sigterm(app: web.Application) -> None:
    """SIGTERM drains (see drain.py) and then exits 0; a second SIGTERM exits at once.

    aiohttp installed its own handler (exit at once) before start-up; this replaces it for
    SIGTERM only, so Ctrl-C (SIGINT) still stops a development server straight away.
    """
    loop = asyncio.get_running_loop()
    controller = app[drain.DRAIN_KEY]

    exiting = False

    def exit_now() -> None:
        nonlocal exiting
        if exiting:
            # Already leaving: a second SIGTERM started the shutdown, whose ending of every
            # call then finished the drain too. A second GracefulExit would escape run_app's
            # cleanup as exit status 1.
            return
        exiting = True
        raise GracefulExit()  # a SystemExit: run_app leaves its loop and shuts down

    def on_sigterm() -> None:
        if controller.draining:
            log.info("second SIGTERM: ending every call now")
            exit_now()
        controller.start("SIGTERM")

    def exit_soon() -> None:
        loop.call_soon(exit_now)

    controller.on_drained = exit_soon
    try:
        loop.add_signal_handler(signal.SIGTERM, on_sigterm)
    except NotImplementedError:  # Windows: keep aiohttp's default (exit at once)
        pass


if __name__ == "__main__":
    sys.exit(main())
