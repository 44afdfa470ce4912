"""Reading a CSV file as store rows, one line at a time, with line numbers.

The file is read in binary and each physical line decoded on its own, so an
encoding error names the exact line (a text-mode file decodes 8 KiB chunks
and would blame whichever row happened to be parsed when a chunk failed).
Nothing is held but the current row, the header, and one uint64 per record:
the line the record starts on, so a duplicate key found after the last row
can still be reported by line.
"""

import csv
import logging
import os
import time
from array import array

from forkserve.store.layout import StoreError

__all__ = ["CsvRows", "PROGRESS_EVERY"]

log = logging.getLogger("forkserve.store")

#: A progress callable is called after this many rows, and once at the end.
PROGRESS_EVERY = 10_000


class CsvRows:
    """Iterate a UTF-8 CSV file as (key, {column: value}) pairs.

    The first line is the header. Blank lines are skipped. Every other row
    must have as many fields as the header and a non-empty key.
    """

    def __init__(self, csv_path, key, progress=None):
        self.path = os.fspath(csv_path)
        self.key = key
        self.progress = progress if progress is not None else LogProgress(self.path)
        self.lines = array("Q")
        self.bytes_read = 0

    def describe(self, record):
        """Name record `record` (counted from 0) by the line it starts on."""
        return f"{self.path}, line {self.lines[record]}"

    def __iter__(self):
        with open(self.path, "rb") as file:
            total = os.fstat(file.fileno()).st_size
            reader = csv.reader(self._decoded_lines(file))
            try:
                yield from self._rows(reader, total)
            except csv.Error as exc:
                raise StoreError(f"{self.path}, line {reader.line_num}: {exc}") from None

    def _rows(self, reader, total):
        header = self._read_header(reader)
        width = len(header)
        key_index = header.index(self.key)
        progress = self.progress
        done = 0
        line = reader.line_num
        for row in reader:
            first_line, line = line + 1, reader.line_num
            if not row:
                continue
            if len(row) != width:
                raise StoreError(f"{self.path}, line {first_line}: {len(row)} fields, "
                                 f"but the header has {width}")
            key = row[key_index]
            if not key:
                raise StoreError(f"{self.path}, line {first_line}: the key column "
                                 f"{self.key!r} is empty")
            self.lines.append(first_line)
            yield key, dict(zip(header, row))
            done += 1
            if done % PROGRESS_EVERY == 0:
                progress(done, self.bytes_read, total)
        progress(done, self.bytes_read, total)

    def _read_header(self, reader):
        header = next(reader, None)
        if header is None:
            raise StoreError(f"{self.path} is empty: the first line must be a header "
                             f"naming the columns")
        if self.key not in header:
            columns = ", ".join(map(repr, header)) or "none, line 1 is blank"
            raise StoreError(f"{self.path} has no column {self.key!r}; the header "
                             f"(line 1) has these columns: {columns}")
        seen = set()
        for column in header:
            if column in seen:
                raise StoreError(f"{self.path}, line 1: column {column!r} appears twice "
                                 f"in the header; rename one")
            seen.add(column)
        return header

    def _decoded_lines(self, file):
        encoding = "utf-8-sig"  # tolerate a byte order mark on the first line only
        for number, raw in enumerate(file, 1):
            self.bytes_read += len(raw)
            try:
                yield raw.decode(encoding)
            except UnicodeDecodeError as exc:
                bad = raw[max(0, exc.start - 10):exc.end + 10]
                raise StoreError(
                    f"{self.path}, line {number}: not valid UTF-8 ({exc.reason} at byte "
                    f"{exc.start} of the line, near {bad!r}); convert the file first, "
                    f"e.g. iconv -f latin1 -t utf-8") from None
            encoding = "utf-8"


class LogProgress:
    """Default progress report: a log line at INFO every `interval` seconds.

    Builds that finish within one interval log nothing, so small files stay
    quiet and large ones show they are alive.
    """

    #: Seconds between log lines.
    interval = 5.0

    def __init__(self, name):
        self.name = name
        self.started = self.last = time.monotonic()

    def __call__(self, rows, bytes_read, total_bytes):
        now = time.monotonic()
        if now - self.last < self.interval:
            return
        self.last = now
        percent = 100 * bytes_read / total_bytes if total_bytes else 100
        log.info("%s: %d rows read, %.0f%% of %.1f MB, %.0f s", self.name, rows,
                 percent, total_bytes / 1e6, now - self.started)
