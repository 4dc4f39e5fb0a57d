"""Celery 5.7's own integration suite, plain and with pikku-celery installed; see README.md.

    .venv/bin/python -m bench.celery_suite.run [--mode plain|all|steps|backend|every]

Each mode runs ``t/integration/test_tasks.py``, ``test_canvas.py`` and ``test_inspect.py``
of Celery's sdist in a pytest process of its own (Redis as broker and result backend, or in
the backend mode pikku-celery's result backend), then prints its counts, its time, whether it
hung at teardown, the tests whose result differs from plain and, for the mirrored modes, what
the mirror's fresh database holds.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from bench.celery_suite.gates import gated_tests
from bench.celery_suite.mirror_check import journal_report, read_mirror
from bench.celery_suite.report import MirrorReading, load_baseline, render, summarize
from bench.celery_suite.session import BACKEND_ALIAS, MODES, Settings, pikku_source, run_mode
from bench.celery_suite.sources import DEFAULT_CACHE, SUITE_FILES, prepare

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.celery_suite.run",
        description="Celery 5.7's integration suite plain, with mirror='all', with "
        "mirror='steps' and with pikku-celery as the result backend, compared.",
    )
    parser.add_argument("--mode", choices=[*MODES, "every"], default="every")
    parser.add_argument(
        "--cache",
        type=Path,
        default=Path(os.environ.get("PIKKU_SUITE_CACHE") or DEFAULT_CACHE),
        help=f"the sdist, helper packages and every run's files (default {DEFAULT_CACHE}, "
        "or $PIKKU_SUITE_CACHE)",
    )
    parser.add_argument(
        "--redis-url",
        default="redis://127.0.0.1:6379/9",
        help="broker and result backend (TEST_BROKER, TEST_BACKEND); this database is flushed "
        "before each mode (default redis://127.0.0.1:6379/9)",
    )
    parser.add_argument("--database", choices=["sqlite", "postgresql"], default="sqlite")
    parser.add_argument(
        "--pg-url",
        default="postgresql://postgres@127.0.0.1:5432/test",
        help="with --database postgresql: a server where database <pg-prefix>_<mode> "
        "is dropped and created for each mode",
    )
    parser.add_argument(
        "--pg-prefix",
        default="pikku_celery_suite",
        help="the mode's database is <pg-prefix>_<mode>; give two invocations that run at "
        "once prefixes of their own (default pikku_celery_suite)",
    )
    parser.add_argument("--timeout", type=float, default=2400.0, help="seconds per mode")
    parser.add_argument("--test-timeout", type=float, default=300.0, help="seconds per test")
    parser.add_argument(
        "--settle",
        type=float,
        default=15.0,
        help="seconds the worker stays up after the last test, before teardown",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        help="a plain mode's summary.json to compare with (default: this invocation's plain "
        "mode, else the newest one in the cache that ran the same tests)",
    )
    parser.add_argument(
        "--tests", nargs="+", default=list(SUITE_FILES), help="test files or node ids"
    )
    parser.add_argument("-k", dest="keyword", help="pytest -k expression")
    parser.add_argument(
        "--gates",
        choices=["open", "closed"],
        default="open",
        help="the backend mode: 'open' (default) names the result backend "
        f"{BACKEND_ALIAS}+<database>, so the tests that require a result_backend starting "
        "with 'redis' run on pikku-celery's backend; 'closed': pikku+<database>, they skip",
    )
    parser.add_argument(
        "--pikku",
        default="HEAD",
        metavar="COMMIT|worktree",
        help="the pikku-celery the mirrored modes run: a commit of this repository, exported "
        "with git archive into the cache (default HEAD), or 'worktree' for the files as they "
        "are (others may be editing them)",
    )
    parser.add_argument(
        "--render",
        type=Path,
        metavar="RUN_FOLDER",
        help="run nothing: print the report of an earlier invocation (its folder under "
        "<cache>/runs) from its summary.json files",
    )
    return parser


def _render_earlier(folder: Path) -> int:
    found = [folder / mode / "summary.json" for mode in MODES]
    docs = [json.loads(path.read_text(encoding="utf-8")) for path in found if path.exists()]
    if not docs:
        raise SystemExit(f"no summary.json under {folder}")
    print("\n\n".join(render(doc) for doc in docs))
    return 0


def _newest_plain(cache: Path, selection: dict[str, Any]) -> Path | None:
    """The newest plain run of the same tests (a -k or --tests subset is no baseline)."""
    found = sorted((cache / "runs").glob("*/plain/summary.json"), key=lambda p: p.stat().st_mtime)
    for path in reversed(found):
        if json.loads(path.read_text(encoding="utf-8")).get("selection") == selection:
            return path
    return None


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.render is not None:
        return _render_earlier(args.render)
    modes = list(MODES) if args.mode == "every" else [args.mode]
    sources = prepare(args.cache)
    pikku = pikku_source(args.pikku, args.cache)
    print(f"pikku-celery: {pikku.label}", flush=True)
    out = args.cache / "runs" / time.strftime("%Y%m%d-%H%M%S")
    settings = Settings(
        out=out,
        redis_url=args.redis_url,
        database=args.database,
        pg_url=args.pg_url,
        timeout=args.timeout,
        test_timeout=args.test_timeout,
        settle=args.settle,
        pikku=pikku,
        tests=tuple(args.tests),
        pytest_args=("-k", args.keyword) if args.keyword else (),
        gates=args.gates,
        pg_prefix=args.pg_prefix,
    )
    baseline_path: Path | None = args.baseline
    selection = {"tests": list(settings.tests), "keyword": args.keyword}
    if baseline_path is None and "plain" not in modes:
        baseline_path = _newest_plain(args.cache, selection)
        if baseline_path is None:
            print("no plain run of these tests in the cache: nothing to compare with")
    baseline: dict[str, Any] | None = (
        None if baseline_path is None else load_baseline(baseline_path)
    )
    gated = frozenset(gated_tests(sources.root, settings.tests))
    texts: list[str] = []
    for mode in modes:
        run = run_mode(mode, sources, settings)
        mirror = None
        if run.database_url is not None and run.journal_dir is not None:
            left = read_mirror(run.database_url)
            path = pikku.pythonpath
            before = journal_report(run.database_url, run.journal_dir, path, replay=False)
            replayed = journal_report(run.database_url, run.journal_dir, path, replay=True)
            mirror = MirrorReading(left, before, replayed, read_mirror(run.database_url))
        doc = summarize(run, mirror, None if mode == "plain" else baseline, gated)
        doc["selection"] = selection
        if mode == "backend":
            doc["gates"] = args.gates
        if mode != "plain":
            doc["pikku"] = {
                "label": pikku.label,
                "commit": pikku.commit,
                "path": None if pikku.path is None else str(pikku.path),
                "changed_files": list(pikku.changed_files),
                "imported_from": run.session.get("pikku_celery_file"),
            }
        (run.folder / "summary.json").write_text(json.dumps(doc, indent=2), encoding="utf-8")
        if mode == "plain":
            baseline = doc
        text = render(doc)
        (run.folder / "report.txt").write_text(text + "\n", encoding="utf-8")
        print(text, flush=True)
        texts.append(text)
    (out / "report.txt").write_text("\n\n".join(texts) + "\n", encoding="utf-8")
    print(f"\nreports and every mode's files: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
