"""Bounds of the Kestrel memcache front, with the unit last in each name and the reason for each.

Kestrel 2.x bounds neither the request line nor the item size at the protocol level (spec §1.1): its
framing buffers until it sees LF and reads whatever byte count a storage line announces. Kayos
cannot afford unbounded buffers per connection, so the front sets the bounds below. Both are chosen
so that no request a real Kestrel client sends comes near them; how each overflow is answered is
part of the protocol and lives in the codecs (``kestrel_compat/wire/``) and
``docs/kestrel-compat.md``.

Kayos-wide bounds live in ``kayos/limits.py``; this module only narrows them. A connection may be
built with lower bounds (tests do), never higher ones.
"""

from __future__ import annotations

from kayos import limits as kayos_limits

# --- numbers on the wire -------------------------------------------------------------------------

# Kestrel parses every number (flags, exptime, byte count, t=, counts, seconds) with Java's
# Integer.parseInt, so the accepted range is exactly the 32-bit signed range; anything outside it is
# a parse failure with the same consequence as a non-number (spec §1.3).
java_int_min = -(2**31)
java_int_max = 2**31 - 1

# --- framing -------------------------------------------------------------------------------------

# Longest request line, in bytes before the LF (a CR, if any, counts). The longest legitimate lines
# are `dump_stats` with many queue names and `set` with a long name and four numbers; 16 KiB holds
# sixty names of 255 bytes (a journal file name cannot be longer) and is the same bound h11 picked
# for HTTP heads after surveying node, tomcat, IIS and Apache. Kestrel itself has no bound.
line_bytes_max = 16 * 1024

# Largest item a `set` may carry, in bytes. Kayos stores nothing larger, so a larger payload is read
# and thrown away without being buffered, and answered the way Kestrel answers an item above a
# queue's maxItemSize: `NOT_STORED`, connection kept (spec §2, §4).
value_bytes_max = kayos_limits.value_bytes_max

# The two bytes after a storage payload (normally CRLF). Kestrel skips them without looking.
payload_terminator_bytes = 2

# GET keys whose parsed request the codec keeps, least recently used dropped first. Clients read
# a few queues with a few option sets each (`q/open`, `q/close`, `q/t=500`); each kept key costs
# a key of at most line_bytes_max and one small event, for the whole process.
get_key_cache_entries_max = 1024

assert java_int_max == 2_147_483_647, "Java's Integer.MAX_VALUE"
assert 1024 <= line_bytes_max <= 64 * 1024, "a request line is a command, a key and a few numbers"
assert line_bytes_max < value_bytes_max, "a request line is never allowed to outgrow an item"
assert value_bytes_max <= kayos_limits.value_bytes_max, (
    "the front never accepts what Kayos can't store"
)
assert value_bytes_max + payload_terminator_bytes <= java_int_max, "a byte count is a Java int"

# --- the text protocol (spec §10) ---------------------------------------------------------------

# Kestrel's TextCodec.MAX_PUT_BUFFER: a put holds at most this many item lines; the line after the
# last one ends the put whatever it holds, and is lost. Kestrel's number, kept exactly.
text_put_items_max = 1024

# Longest item line of a text put, in bytes before the LF (a CR counts). Text items are lines, so
# this is Kayos's item bound; a longer line is read and thrown away unbuffered, and its item is
# refused as one above maxItemSize would be (not counted in the put's reply).
text_item_line_bytes_max = value_bytes_max

# Item bytes one text put may hold, after Kestrel's UTF-8 re-encoding. A put is served as one
# request, so all its items are in memory at once; 1024 items of 64 KiB fit, and items past the
# bound are thrown away and refused like items above maxItemSize.
text_put_bytes_max = 64 * 1024 * 1024

assert text_put_items_max == 1024, "Kestrel's MAX_PUT_BUFFER"
assert text_item_line_bytes_max <= text_put_bytes_max, "one largest item fits in a put"

# --- the thrift protocol (spec §11) -------------------------------------------------------------

# Largest frame of the framed transport, in bytes after the 4-byte length, either way. A call
# carries at most a put of items, so this holds two of the largest items with their framing;
# Kestrel (Finagle) sets no bound. A longer announced frame closes the connection, as Apache
# Thrift's servers do, since nothing can be answered without reading the call.
thrift_frame_bytes_max = 2 * value_bytes_max + 64 * 1024

# Items one thrift `get` returns at most, whatever `max_items` asks: the reply is one frame built in
# memory. Kestrel has no bound; clients ask for tens to hundreds.
thrift_get_items_max = 65_536

# A thrift `get` stops fetching once the items it holds reach this many bytes, so with the one item
# that may cross it, its reply fits in a frame.
thrift_get_reply_bytes_max = value_bytes_max

# Nested containers and structs one thrift value may hold; Kestrel's calls nest two deep (a list of
# Item structs). Deeper values from a peer are a protocol error, not a recursion.
thrift_nesting_max = 16

assert thrift_get_reply_bytes_max + value_bytes_max + 64 * 1024 <= thrift_frame_bytes_max
assert thrift_frame_bytes_max <= java_int_max, "a frame length is a signed 32-bit int"

# --- the server ----------------------------------------------------------------------------------

# Commands decoded but not yet served, per connection. Requests are served one at a time; past this
# many the server stops reading the socket until the session catches up, so a client that pipelines
# without reading replies costs a bounded amount of memory (with line_bytes_max per request).
pending_requests_max = 1024

# Bytes read from the socket per call; small enough that one connection cannot hog the loop.
read_chunk_bytes = 64 * 1024

# Replies the transport may buffer before the server waits for the client to read them
# (asyncio's write-buffer high-water mark). One large item reply may exceed it once.
write_buffer_bytes_max = 1024 * 1024

# Kestrel's timer resolution for blocked fetches is 100 ms (spec §3.5); a deadline this close is
# served as reached, so no fetch waits on a timer shorter than Kestrel would.
waiter_resolution_ms = 100

# The longest `t=` or MONITOR wait honoured: Java's int milliseconds, about 24.8 days.
wait_ms_max = java_int_max

# Kestrel stops the server about 100 ms after `shutdown` (spec §2); the reply-less close goes first.
shutdown_delay_ms = 100

# How long a graceful stop waits for connections to finish their current request before closing
# them, and for the backend to take the last group commits.
shutdown_grace_ms = 2_000

# --- persistence (kestrel_compat/core/persistence.py, kestrel_compat/backends/) ---------------

# A consumer group's opaque state blob; Kayos stores it beside the hwm and bounds it at 64 KiB
# (docs/node-api.md, `gstate/<queue>/<group>`).
group_blob_bytes_max = 64 * 1024

# Items one backend append carries, and entries one recovery read asks for: a bounded batch each.
append_batch_entries_max = 1024
recovery_read_entries = 4096

# A failed group commit (the backend down, e.g. a Kayos cluster outage longer than a node's 30 s
# commit bound) is retried after a backoff whose ceiling doubles from the min to the max, in ms,
# with jitter. The min is a few backend round trips, so a passing fault costs little; the max is
# how late the end of an outage is noticed, at one commit per failing queue per retry. Retries go
# on while the queue exists: giving up would leave a confirmed removal only in memory, to come
# back after a crash.
commit_retry_delay_ms_min = 100
commit_retry_delay_ms_max = 10_000
# Counter values tried for one item key that the key hash puts in the log's shard of a Kayos queue
# over S shards (kestrel_compat/backends/kayos_backend.py): a value lands there with chance 1/S
# (S at most the topology's shards), so 64 x 64 tries miss only with chance about e^-64 at S = 64.
key_tries_max = 64 * 64

assert pending_requests_max >= 1
assert 0 < commit_retry_delay_ms_min <= commit_retry_delay_ms_max
assert waiter_resolution_ms < shutdown_grace_ms
assert append_batch_entries_max <= kayos_limits.batch_entries_max, "one append is one Kayos batch"

# --- read-behind (docs/kestrel-compat.md section 10) ---------------------------------------------

# How long a fetch waits for a refill when its queue's items are all behind (in the log only),
# whatever its t=: one or a few backend reads of recovery_read_entries, far less than this unless
# the cluster is away, when the fetch answers as an empty one rather than hang.
read_behind_wait_ms = 30_000

# --- journal import (kestrel_compat/migration/, docs/migrating-from-kestrel.md) ------------------

# Items and bytes of one all-or-nothing produce of `kayos import-kestrel`: large enough that the
# per-request cost (a round trip through the chain and an fsync on each replica) is spread over
# many items, small enough that a batch is a small fraction of a Kayos batch and of the node's
# group commit, and that a retried batch resends little.
import_batch_entries_max = 4096
import_batch_bytes_max = 8 * 1024 * 1024
# Batches of one queue sent before the oldest is answered: the client builds and sends the next
# while the chain commits the previous ones. One connection carries them in send order and the head
# takes seqs in arrival order; the importer still checks the seqs, and re-imports the queue one
# batch at a time if a retried batch ever landed behind a later one.
import_batches_in_flight = 8
# Bytes read from a journal file at a time: the reader's buffer never holds more than this plus
# one partial record.
journal_read_chunk_bytes = 1024 * 1024

assert import_batch_entries_max <= kayos_limits.batch_entries_max
assert import_batch_bytes_max <= kayos_limits.batch_bytes_max // 2, "room for keys and headers"
