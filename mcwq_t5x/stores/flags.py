"""The command-line flags that name a SPARQL store, and the store they name.

Command lines that query a store (`preprocessing.migrate`, `python -m mcwq_t5x.score --execute`)
define the remote endpoint's flags with `add_endpoint_arguments` and build the store they name
with `endpoint_from_arguments`: `mcwq_t5x.stores.remote.RemoteEndpoint` or the embedded
`mcwq_t5x.stores.oxigraph.embedded_store`.
"""

from __future__ import annotations

import argparse
from typing import Any

from mcwq_t5x.stores import oxigraph
from mcwq_t5x.stores import remote
from mcwq_t5x.stores import transport
from mcwq_t5x.stores.endpoint import Endpoint


def add_endpoint_arguments(parser: Any,
                           embedded_timeout: bool = False,
                           max_retry_after: bool = False) -> None:
  """Adds `--url`, `--user-agent`, `--timeout`, `--retries`, `--rate` (and if asked
  `--max-retry-after`) to `parser`; argparse.ArgumentError if one is already there."""
  parser.add_argument("--url", default=remote.WDQS_URL, help="remote SPARQL endpoint URL")
  parser.add_argument(
      "--user-agent",
      "--user_agent",  # why: both spellings of a two-word flag set `args.user_agent`
      dest="user_agent",
      default=remote.DEFAULT_USER_AGENT,
      help="remote: User-Agent header of the requests")
  parser.add_argument(
      "--timeout",
      type=float,
      default=remote.DEFAULT_TIMEOUT_S,
      help=("bound of one query, remote (whole request) or embedded (s)"
            if embedded_timeout else "remote: request timeout (s)"))
  parser.add_argument(
      "--retries",
      type=int,
      default=remote.DEFAULT_MAX_RETRIES,
      help="remote: retries on 429/5xx/connection errors")
  if max_retry_after:
    parser.add_argument(
        "--max-retry-after",
        "--max_retry_after",
        dest="max_retry_after",
        type=float,
        default=transport.DEFAULT_MAX_RETRY_AFTER_S,
        help="longest Retry-After wait accepted from the remote endpoint (s); a longer "
        "one stops the run")
  parser.add_argument(
      "--rate",
      type=float,
      default=remote.DEFAULT_MIN_INTERVAL_S,
      help="remote: minimum seconds between requests")


def remote_endpoint_from_arguments(args: argparse.Namespace) -> remote.RemoteEndpoint:
  """The `RemoteEndpoint` of `add_endpoint_arguments`' flags (nothing sent); ValueError:
  `--timeout`."""
  return remote.RemoteEndpoint(
      url=args.url,
      user_agent=args.user_agent,
      timeout_s=args.timeout,
      max_retries=args.retries,
      min_interval_s=args.rate,
      max_retry_after_s=getattr(args, "max_retry_after", transport.DEFAULT_MAX_RETRY_AFTER_S))


def endpoint_from_arguments(args: argparse.Namespace,
                            embedded_timeout: bool = False,
                            allow_empty: bool = False) -> Endpoint:
  """The store `args.endpoint` names ("remote" or "oxigraph"), not cached;
  `oxigraph.embedded_store`'s errors pass through."""
  if args.endpoint == "remote":
    return remote_endpoint_from_arguments(args)
  return oxigraph.embedded_store(
      args.codex or None,
      args.ntriples or (),
      timeout_s=args.timeout if embedded_timeout else None,
      allow_empty=allow_empty)
