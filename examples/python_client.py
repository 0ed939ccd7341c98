#!/usr/bin/env python3
"""Allocate an account's Kinesis hash key, read it back and find its shard.

Usage: python_client.py BASE_URL ACCOUNT [--weight W] [--shards N] [--token TOKEN]
Needs the generated package keyspread_api (see python_client.md).
"""

import argparse
import os
import sys
import uuid

import httpx

from keyspread_api import AuthenticatedClient, Client
from keyspread_api.api.keys import allocate, lookup
from keyspread_api.api.shards import shard_of
from keyspread_api.models import AllocateRequest, Assignment
from keyspread_api.types import UNSET


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base_url", help="e.g. http://127.0.0.1:8080")
    parser.add_argument("account")
    parser.add_argument("--weight", type=int, help="relative load of a new account (default 1)")
    parser.add_argument("--shards", type=int, default=4, help="shards of a uniform stream map")
    parser.add_argument("--token", default=os.environ.get("KEYSPREAD_TOKEN"), help="bearer token, if set")
    args = parser.parse_args()

    # Mutations need the token when the server has one; loopback needs none.
    if args.token:
        client = AuthenticatedClient(base_url=args.base_url, token=args.token)
    else:
        client = Client(base_url=args.base_url)

    # 201 when the account is new, 200 with the same key when it had one. The
    # Idempotency-Key names this allocation: if its answer is lost (a dropped connection, a
    # 504), sending it again with the same key is told the first answer, never applied twice.
    body = UNSET if args.weight is None else AllocateRequest(weight=args.weight)
    key = str(uuid.uuid4())
    for attempt in range(3):
        try:
            response = allocate.sync_detailed(args.account, client=client, body=body, idempotency_key=key)
        except httpx.TransportError as error:
            if attempt == 2:
                sys.exit(f"allocate: {error}")
            continue
        if response.status_code != 504:
            break
    if not isinstance(response.parsed, Assignment):
        sys.exit(f"allocate: HTTP {response.status_code}: {response.content.decode()}")
    status = "allocated" if response.status_code == 201 else "already had"
    print(f"{status} {response.parsed.account}: ExplicitHashKey={response.parsed.hash_key}")

    # sync() returns the parsed body: an Assignment, or a Problem on 404.
    assignment = lookup.sync(args.account, client=client)
    print(f"lookup: {assignment.hash_key} weight={assignment.weight} since {assignment.created_at}")

    where = shard_of.sync(client=client, account=args.account, shards=args.shards)
    print(f"with {args.shards} shards it lands on {where.shard_id} (index {where.shard_index})")


if __name__ == "__main__":
    main()
