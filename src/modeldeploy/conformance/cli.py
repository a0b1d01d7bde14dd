"""`modeldeploy conformance URL`: run the serving-contract suite, print a table, write evidence."""

from __future__ import annotations

import argparse
import os
import sys

import httpx

from modeldeploy.conformance.suite import CHECKS, ConformanceConfig, run_conformance


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("url", help="server base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--api-key", default=os.environ.get("MODELDEPLOY_API_KEY"), help="bearer token for /v1/*")
    p.add_argument("--model", default=None, help="model name (default: first in /v1/models)")
    p.add_argument("--json", dest="json_out", default=None, help="write the JSON evidence record here")
    p.add_argument("--requests", type=int, default=8, help="bounded load: number of requests")
    p.add_argument("--concurrency", type=int, default=4, help="bounded load: client workers")
    p.add_argument("--timeout", type=float, default=60.0, help="per-request timeout in seconds")
    p.add_argument("--expect-bundle", default=None, help="fail unless the server serves this bundle id")
    p.add_argument("--skip", action="append", default=[], choices=CHECKS, help="skip a check (repeatable)")
    p.add_argument(
        "--structured-output",
        action="store_true",
        help="also check response_format json_schema (the bundle declares structured output)",
    )


def main(args: argparse.Namespace) -> int:
    if not args.url.startswith(("http://", "https://")):
        print(
            f"modeldeploy conformance: error: URL must start with http:// or https://, got {args.url!r}",
            file=sys.stderr,
        )
        return 2
    cfg = ConformanceConfig(
        url=args.url,
        api_key=args.api_key,
        model=args.model,
        requests=args.requests,
        concurrency=args.concurrency,
        timeout_s=args.timeout,
        skip=args.skip,
        expect_bundle=args.expect_bundle,
        structured_output=args.structured_output,
    )
    try:
        report = run_conformance(cfg, log=lambda s: print(s, file=sys.stderr))
    except ValueError as e:
        print(f"modeldeploy conformance: error: {e}", file=sys.stderr)
        return 2
    except httpx.HTTPError as e:
        print(f"modeldeploy conformance: error: cannot reach {args.url}: {e}", file=sys.stderr)
        return 2
    print(report.table())
    if args.json_out:
        report.write(args.json_out)
        print(f"evidence written to {args.json_out}")
    return 0 if report.passed else 1
