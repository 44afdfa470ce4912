"""`forkserve store build|info|get|shard` (also `python -m forkserve.store`):
make, inspect and shard store files from the shell."""

from forkserve.store import Store, StoreError
from forkserve.store.layout import HEADER, VERSION

__all__ = ["main"]

def main(argv=None, prog="python -m forkserve.store"):
    """forkserve store build|info|get|shard: make and inspect store files."""
    import argparse
    import logging
    import sys

    parser = argparse.ArgumentParser(prog=prog, description=main.__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser("build", help="build a store file from a CSV file")
    build.add_argument("csv", help="UTF-8 CSV file whose first line names the columns")
    build.add_argument("--key", required=True, help="column whose value is the lookup key")
    build.add_argument("-o", "--output", required=True, help="store file to write")
    build.add_argument("--codec", default="row", help="value codec (default: row)")
    build.add_argument("--shards", type=int, default=None, metavar="N",
                       help="write N files, OUTPUT with .shardI-of-N before its suffix, each "
                            "holding the keys of one shard (see the shard command)")
    info = commands.add_parser("info", help="describe a store file")
    info.add_argument("store")
    info.add_argument("--verify", action="store_true",
                      help="also checksum every record (reads the whole file)")
    get = commands.add_parser("get", help="print one record's stored bytes")
    get.add_argument("store")
    get.add_argument("key")
    shard = commands.add_parser("shard", help="say which of N shards keys belong to, or print "
                                "the nginx split_clients block that routes the same way")
    shard.add_argument("keys", nargs="*", metavar="KEY")
    shard.add_argument("--shards", type=int, required=True, metavar="N")
    shard.add_argument("--nginx", action="store_true",
                       help="print the nginx split_clients block for N shards")
    args = parser.parse_args(argv)

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from forkserve.store import shards, split
    try:
        if args.command == "shard":
            return _shard_command(args)
        if args.command == "build" and args.shards is not None:
            for path in split.build_csv_shards(args.csv, args.key, args.output, args.shards,
                                               codec=args.codec):
                with Store.open(path) as store:
                    print(f"{path}: {len(store)} records, {store.nbytes / 1e6:.1f} MB")
        elif args.command == "build":
            with Store.from_csv(args.csv, args.key, args.output, codec=args.codec) as store:
                print(f"{args.output}: {len(store)} records, {store.nbytes / 1e6:.1f} MB")
        elif args.command == "info":
            with Store.open(args.store) as store:
                print(_describe(store))
                if args.verify:
                    store.verify()
                    print(f"{'verified:':12}every record and the index match their checksums")
        else:
            with Store.open(args.store) as store:
                value = store.get_raw(args.key)
                if value is None:
                    print(f"{args.store}: no record for {args.key!r}", file=sys.stderr)
                    return 1
                sys.stdout.buffer.write(value + b"\n")
    except (StoreError, OSError, shards.ShardError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def _shard_command(args):
    from forkserve.store import shards
    if args.nginx:
        print(shards.split_clients_block(args.shards), end="")
    bounds = shards.upper_bounds(args.shards)
    for key in args.keys:
        print(f"{shards.shard_of(key, args.shards, bounds=bounds)}\t{key}")
    if not args.keys and not args.nginx:
        raise shards.ShardError("give one or more keys, or --nginx for the split_clients block")
    return 0


def _describe(store):
    layout = store._layout
    count = len(store)
    records = layout.data_end - HEADER.size
    index = layout.trailer_start - layout.tags_start
    lines = [
        ("path", store.path),
        ("format", f"forkserve store, version {VERSION}"),
        ("codec", store.codec),
        ("records", f"{count:,}"),
        ("size", f"{store.nbytes:,} bytes: {records:,} of records, {index:,} of index"),
        *_schema_lines(store),
        ("per record", f"{store.nbytes / max(count, 1):,.0f} bytes on average"),
        ("hash table", f"{layout.nslots:,} slots, {count / layout.nslots:.0%} in use"),
    ]
    return "\n".join(f"{label + ':':12}{value}" for label, value in lines)


def _schema_lines(store):
    if store.fields is None:
        return []
    return [("fields", f"{len(store.fields)}, stored once: {', '.join(store.fields)}")]

