"""Every bound Kayos keeps, in one place, with its unit last in its name and the reason for it.

Relationships between bounds are asserted at import, so an edit that breaks one fails loudly.
Configuration may lower (never raise) the per-item bounds; the storage-level ones are part of the
on-disk format and fixed.

Why it is long: it is a table, each bound beside its reason, read from top to bottom
when a bound is chosen or questioned; its asserts tie bounds of different layers together (a
frame holds a batch, a batch a store chunk, a consume page a store scan page, the manager's
detection window the links' silence bound), which a split by layer would scatter across files.
"""

from __future__ import annotations

# --- storage format (see docs/storage-format.md) ------------------------------------------------

# The file is split into 4 KiB blocks, the page size of every disk and OS we run on; a header always
# starts a block so recovery can step back block by block to find it.
block_bytes = 4096

# A chunk's length field is 32 bits with the top bit reserved; no chunk may come near that, and a
# length above this bound is taken as corruption rather than trusted.
chunk_bytes_max = 64 * 1024 * 1024

# A header chunk (length + CRC + body) fits in the rest of its block after the type byte, so it is
# read with one pread and never split; its fields are a few counters and pointers.
header_bytes_max = block_bytes - 1

# Leaves are cut by bytes, not count: Python pays ~10-15 us per node (encode + CRC) regardless of
# size, so nodes are larger than couchstore's 1279 B. 64 entries of 100-B values is ~8 KiB, the best
# of 32/64/128 measured in reference/storage-engine.md.
leaf_bytes_target = 8 * 1024
# Interior nodes hold (first_seq, pointer, count) triples; 128 children keeps trees 3 levels deep up
# to ~100M entries.
interior_children_max = 128

# Values larger than this are written as their own chunk outside the leaf, so leaves stay small and
# scans of small messages stay one pread per ~64 entries.
value_inline_bytes_max = 2048

# --- items ---------------------------------------------------------------------------------------

# An item key as a producer gives it: memcache's bound, so every Kestrel key fits.
item_key_bytes_max = 250
# Queue names are part of every stored key (a shard holds many queues), so they stay short.
queue_name_bytes_max = 128
# A stored key is the queue name, one 0 byte and the item key. Keys index the de-dup table, and
# lmdb keys are limited to 511 bytes by default.
key_bytes_max = 384
# One item: Kestrel's practical ceiling and well under chunk_bytes_max.
value_bytes_max = 16 * 1024 * 1024
# Seqs, expiries (ms since the Unix epoch) and every other integer a request carries are u64 on the
# wire (msgpack) and in the store; a larger one is refused where it enters, before it takes a seq.
u64_max = 2**64 - 1
# Headers are small metadata, not a second payload.
headers_bytes_max = 64 * 1024
# One commit batch, in entries and bytes: bounds the memory a single producer can pin and the
# latency a single batch adds to everyone in the same group commit.
batch_entries_max = 100_000
batch_bytes_max = 64 * 1024 * 1024

# --- group commit --------------------------------------------------------------------------------

# Batches queued for the committer beyond this make producers wait (back-pressure), bounding memory.
commit_queue_batches_max = 1024
# One group commit takes at most this many bytes of queued batches, so one fsync never covers an
# unbounded amount of work.
group_commit_bytes_max = 32 * 1024 * 1024

# --- caches and derived state -------------------------------------------------------------------

# Decoded interior nodes kept in memory (the write path and every lookup walk them).
node_cache_entries_max = 4096
# lmdb map size: virtual address space only, grown lazily by the OS.
index_map_bytes = 1 << 40
# The derived index is flushed (lmdb sync + successor map flush) every this many commits, by a
# background thread: this bounds its dirty pages, not the replay after a crash (an OS crash
# rebuilds the index anyway; a process crash loses no page; kayos/storage/disk/index.py).
# Commits that overlap a flush fault on the pages it cleaned (single-entry commit CPU p99
# 132 -> 720 us at every 256 commits), so it runs about as often as kernel writeback would, not
# more.
index_checkpoint_commits = 16384
# Rebuilding the derived index from the file (an open after a snapshot copy, a wiped index) applies
# the leaves it reads in lmdb write transactions of at least this many entries each, not one per
# leaf: a leaf of 8 KB values holds two entries, and a transaction per leaf was half the rebuild's
# time (1 GiB, 134k entries: 0.75 s). It bounds the keys held in memory between two commits.
index_rebuild_txn_entries = 8192
# How far one commit's explicit seqs (or its last_seq) may run past the store's last seq. The
# successor map is an array of 8 bytes per seq up to the last seq, in mmap'd 8 MiB segments of
# 2^20 seqs, so a single absurd seq (a bug, a corrupt frame) would map and grow it to match:
# seq 2^63 is 2^43 segments. A gap of 2^32 seqs adds at most 32 GiB of sparse file in 4,096
# mappings (Linux allows 65,530 per process), yet lets a replica skip over a long compacted
# prefix of its upstream's log in one catch-up commit.
seq_gap_max = 1 << 32

# --- compaction and rollback --------------------------------------------------------------------

# Compaction starts when this fraction of the file is garbage (couchstore and ForestDB use 30%).
compaction_garbage_ratio = 0.30
# ... and the file is at least this large (ns_server skips files under 128 KiB).
compaction_file_bytes_min = 1024 * 1024
# Catch-up rounds run without blocking commits; after this many the final round takes the lock.
compaction_catchup_rounds_max = 10
# Versions superseded within this many seqs of the compaction point survive compaction, so a replica
# can roll back that far without a full resync.
rollback_window_seqs = 100_000
# A rollback walks the store's header chain back (one block read each) at most this many headers
# to find the metadata as of the seq it goes back to; past it the replica keeps its metadata and
# serves no snapshot until a link replaced it (docs/storage-format.md, "Rollback"). A dropped
# suffix is a few commits; this is a second or so of reads on a slow disk. A link's read-back
# piece walks as far for the metadata as of its last seq (past it the piece carries none:
# docs/replication-protocol.md, "Applying batches"); ~67 ms from the page cache here.
rollback_meta_headers_max = 10_000
# The compactor fsyncs the new file every this many bytes, so one large fsync at the end does not
# stall readers (couchstore MB-25509).
compaction_sync_bytes = 64 * 1024 * 1024

# --- reads ---------------------------------------------------------------------------------------

# One page of a snapshot scan; bounds reply size and the memory one consumer pins.
scan_page_entries_max = 10_000
# The page a scan builds when its caller names no size. Small on purpose: 256 entries (~100 KiB
# with 100-B values) stay in a core's L2 cache while the consumer walks them, and are freed
# before the cyclic GC's youngest generation (700 allocations) fills, so the collector never
# walks them. On the storage bench (1M entries) 10,000-entry pages (~4 MiB) scan at ~0.8M
# entries/s, pages of 128-640 entries at ~1.8M.
scan_page_entries_default = 256

assert block_bytes & (block_bytes - 1) == 0, "blocks are a power of two"
assert header_bytes_max < block_bytes < chunk_bytes_max
assert value_inline_bytes_max < leaf_bytes_target, "an inline value always fits a leaf"
assert key_bytes_max <= 511, "lmdb's default key size limit"
assert queue_name_bytes_max + 1 + item_key_bytes_max <= key_bytes_max
assert value_bytes_max + headers_bytes_max + key_bytes_max < chunk_bytes_max
assert batch_bytes_max <= group_commit_bytes_max * 2
assert 0.0 < compaction_garbage_ratio < 1.0
assert 0 < scan_page_entries_default <= scan_page_entries_max

# --- replication wire protocol (see docs/replication-protocol.md) --------------------------------

# One frame (kind byte + msgpack body) carries at most one full batch: batch_bytes_max of item
# bytes, msgpack's framing per entry (at most 32 B: a u64 seq, a u64 expiry, three length prefixes)
# and a few MiB of metadata. The receiver refuses a larger length before buffering its body.
frame_bytes_max = batch_bytes_max + 8 * 1024 * 1024
# A takeover table gains one entry per change of head; Couchbase keeps 25 in its failover log, and a
# downstream whose common entry was dropped merely does a full reset.
takeover_table_entries_max = 64
# Metadata updates (consumer high-water marks) carried by one BATCH; more wait for the next batch,
# so a burst of consumer commits cannot crowd out log entries.
frame_meta_entries_max = 10_000
# Unacknowledged BATCH frames per replication link: bounds what a slow downstream pins upstream and
# the work redone after a link reset, yet lets the upstream keep streaming while the downstream
# fsyncs (it acknowledges only after each commit). Members forward each accepted batch at once
# (one per producer request at a head), so a window must cover every request a group commit can
# gather: the bytes bound below is the one that matters for memory.
link_in_flight_batches_max = 256
# ... and their bytes; one maximal batch must always fit, or a link could never send it.
link_in_flight_bytes_max = 2 * frame_bytes_max
# Requests a client connection may have awaiting a reply before the node stops reading its socket.
connection_in_flight_requests_max = 1024
# A connection (binary port) that has not finished its handshake (HELLO, and for a replication link
# the HMAC challenge) within this is closed: a half-open or silent connection holds a socket and a
# task, and a genuine peer finishes in one or two round trips.
handshake_ms_max = 5_000
# Until a connection's handshake is done (a client's HELLO; a link's HELLO, AUTH_PROOF and, on the
# connector's side, AUTH_CHALLENGE and HELLO_OK) its frames may be at most this long: those frames
# hold a few short strings, ids and 32-byte nonces (well under 1 KiB), and nothing of a peer that
# proved nothing yet may make the node buffer frame_bytes_max.
handshake_frame_bytes_max = 4096
# Binary-port connections of one node that have not finished their handshake; one past it is
# closed at once. Each holds a socket, a task and up to handshake_frame_bytes_max of buffer for
# at most handshake_ms_max; genuine peers finish in a round trip or two (milliseconds), so even a
# cluster restarting all its links and clients at once stays far below it.
handshake_connections_max = 256
# A topology host name is resolved when its node starts, and again (when a HELLO from it does not
# match) at most this often: a name that moved is followed within seconds, and a flood of
# mismatched HELLOs costs at most one DNS lookup per host per interval.
host_resolve_interval_ms_min = 5_000
# A node id (topology file, HELLO): a short name or host-like label, printed in logs and status.
node_id_bytes_max = 128
# Every connection past its handshake is pinged this often, and a peer heard from (any bytes) not
# for peer_silence_ms_max is marked down and its connection closed: a paused or partitioned chain
# member is noticed within half a second instead of blocking producers unseen, its neighbours'
# links to it close (and they report it to the manager) before the manager's detection window
# ends, and a dead client socket is freed. Three pings fit in the silence bound, so one late PONG
# never trips it; a 300 ms stall of the peer (manager_stall_ms_tolerated) is 450 ms of silence at
# most (the stall after one unanswered ping interval), still under the bound.
ping_interval_ms = 150
peer_silence_ms_max = 500
# The HTTP port closes a connection idle this long: between keep-alive requests, and from the
# connection's start until a request's headers are complete (aiohttp's keepalive_timeout covers
# both), so half-sent requests and idle keep-alive sockets are dropped within this bound.
http_idle_ms_max = 10_000
# A request body (at most http_body_bytes_max) must arrive within this once its headers have: a
# body trickled in or never finished would pin the handler and its buffer. 128 MiB at 100 Mbit/s
# takes about 11 s.
http_body_read_ms_max = 30_000
# On SIGTERM the HTTP port stops taking requests and gives those in progress this long to finish
# before they are cancelled (their clients see the connection close, as after a kill): a group
# commit waiting on a stopped chain member would otherwise hold the stop for up to
# produce_commit_timeout_ms, past the launcher's stop bound (10 s), and the node was killed.
http_shutdown_ms_max = 2_000
# Cluster identity: a random shared secret (HMAC-SHA256 key, its own output size) and the nonce each
# side of a link contributes to the handshake (docs/replication-protocol.md, "Peer authentication").
cluster_secret_bytes = 32
auth_nonce_bytes = 32
# A parked WAIT_COMMITTED is answered after at most this long, so it never pins memory for ever.
wait_committed_timeout_ms_max = 60_000
# Learners and repair links (docs/replication-protocol.md, "Learners and repair links"): a member
# serving one while its shard takes live writes (a batch accepted within catchup_live_window_ms)
# starts by spending this share of its time on it (a duty cycle: a pause after each piece sent);
# the copy pacer (kayos.replication.logic.pacing) then moves the share by what live traffic does. An
# idle shard is copied at full speed.
catchup_produce_share_max = 0.2
catchup_live_window_ms = 1_000
# The copy pacer (docs/performance.md, "Pacing a copy"): live entries committed through the serving
# member per copy_pace_window_ms, against the median of its last copy_pace_baseline_windows
# windows before the copy, may drop by at most this fraction (issue 11: produce drops <= 20% during
# a catch-up; issue 13: >= 80% of it during a move) before the copy's share is cut.
catchup_produce_drop_max = 0.2
# One pacer window in ms: long enough to hold many live commits at a few hundred acks/s (a rate
# over fewer is noise), short enough that a copy hurting live traffic is cut within about a second.
copy_pace_window_ms = 1_000
# Windows (of copy_pace_window_ms) whose median live rate is the baseline taken before a copy: the
# median of ten 1 s windows, as the single 5 s mean ranged 154-627 acks/s on a shared box.
copy_pace_baseline_windows = 10
# The share of the serving member's time a copy may take while live traffic flows, in (0, 1]: the
# floor (a copy always moves: at 0.01 a 1 GB catch-up took minutes, docs/performance.md) and the
# ceiling (1: a copy that does not cost live traffic its bound is not paused at all; issue 11 asks
# for >= 50% of the disk's speed, and the unpaced copy itself ran at 40-60% of it here).
copy_pace_share_min = 0.01
copy_pace_share_max = 1.0
# AIMD: per window within the drop the share doubles until the first cut (a slow start: from the
# snapshot's 0.05 to the ceiling in 5 windows, as a 256 MB copy lasts only ~8 s) and grows by this
# much after it; per window past it the share is multiplied by copy_pace_cut (from the ceiling to
# the floor in about 7 windows).
copy_pace_step = 0.05
copy_pace_cut = 0.5
# A learner or repair link reads back pieces of at most this many payload bytes (a chain link:
# batch_bytes_max): each is one commit and fsync downstream, and a short one delays the chain's
# own fsyncs on a shared disk less; 4 MiB is still thousands of small entries per frame.
catchup_piece_bytes_max = 4 * 1024 * 1024
# Store snapshots (docs/replication-protocol.md, "Store snapshots"): a learner holding nothing
# copies the upstream's store file. One SNAPSHOT_CHUNK carries at most this many raw file bytes
# (big enough that per-frame work is noise next to the copy, small next to frame_bytes_max).
snapshot_chunk_bytes_max = 4 * 1024 * 1024
# Received chunks a learner holds while it writes the ones before them (memory: this many times
# snapshot_chunk_bytes_max): receiving and writing overlap instead of taking turns.
snapshot_chunks_queued_max = 4
# A learner copying a store file starts an fdatasync of it in the background every this many bytes
# (not waited for; the one at the end is), so the dirty pages of a large copy reach the disk as it
# goes instead of in one long final sync, and writing never stops for a sync (measured: 1 GiB in
# 4 MiB writes took 0.4 s so against 0.5-2.5 s with a sync waited for every 256 MiB).
snapshot_sync_bytes = 64 * 1024 * 1024
# While its shard takes live writes, a member serving a store snapshot starts by spending this share
# of its time on it (the learner link's duty cycle, chain.copy_pause_s; the copy pacer moves it
# between copy_pace_share_min and copy_pace_share_max from there). Lower than
# catchup_produce_share_max: a snapshot moves far more bytes per unit of the member's time, and
# the learner's writes and CPU land on the same machine and disk (measured: at 0.2 live produce
# dropped by 0.35 on a shared 2-core box, docs/performance.md). Moves onto an added node measured
# 0.58-1.04 of the produce rate before at 0.05 and 0.73-1.00 at 0.02 (kayos bench grow,
# docs/operations.md "What a move costs the producers"): not lowered, as failover catch-up, which
# already misses its copy-speed target under load, would copy 2.5 times slower.
snapshot_produce_share_max = 0.05
# The largest store file a learner accepts as a snapshot, in bytes (its disk, not its memory: the
# copy is streamed to a file); a bigger shard is copied entry by entry.
snapshot_bytes_max = 1024 * 1024 * 1024 * 1024
# Failed snapshot attempts in a row (each restarts from offset 0 after the link backoff) before
# the learner copies entry by entry instead (an upstream that predates the frames, say). With the
# link backoff (at most link_retry_delay_ms_max) that is about half a minute: long enough for an
# upstream that restarts and catches up itself (it refuses snapshots meanwhile).
snapshot_attempts_max = 30
# A node verifies a shard store's every chunk (the walk of `kayos check`) before opening it when
# its data file is at most this big: the walk reads the whole file once (about 1 s per 100 MiB
# on a laptop disk), and a bigger store is checked on read (a CRC that fails is never served).
store_verify_on_open_bytes_max = 1024 * 1024 * 1024
# A salvage cuts back to the newest header before the damage, checks again and repeats at most this
# often (each round drops at least one commit; past it the store restarts empty and is re-fetched).
salvage_rounds_max = 32

assert batch_bytes_max + 32 * batch_entries_max + 1024 * 1024 <= frame_bytes_max
assert frame_bytes_max < 2**31, "the u32 length prefix, with room to spare"
assert 4 * node_id_bytes_max + 1024 <= handshake_frame_bytes_max <= frame_bytes_max
assert link_in_flight_bytes_max >= frame_bytes_max, "one maximal batch always fits in flight"
assert wait_committed_timeout_ms_max < 2**32, "WAIT_COMMITTED's timeout field is a u32"
assert 0 < catchup_produce_share_max <= 1
assert 0 < catchup_piece_bytes_max <= batch_bytes_max
assert catchup_live_window_ms > 0
assert 0 <= catchup_produce_drop_max < 1
assert copy_pace_window_ms > 0
assert copy_pace_baseline_windows >= 1
assert 0 < copy_pace_share_min <= copy_pace_share_max <= 1
assert copy_pace_share_min <= catchup_produce_share_max <= copy_pace_share_max
assert copy_pace_share_min <= snapshot_produce_share_max <= copy_pace_share_max
assert copy_pace_step > 0
assert 0 < copy_pace_cut < 1
assert salvage_rounds_max >= 1
assert 0 < snapshot_chunk_bytes_max + 1024 <= frame_bytes_max
assert snapshot_attempts_max >= 1
assert snapshot_chunks_queued_max >= 1
assert 0 < snapshot_produce_share_max <= 1

# --- store copies that resume and verify (docs/replication-protocol.md, "Store snapshots") ------

# A learner reads a SNAPSHOT_CHUNK's data off the link in pieces of at most this many bytes, each
# written and checked as it comes (docs/replication-protocol.md, "Store snapshots"): the copy's
# verified offset follows the bytes received rather than whole chunks, so a link cut mid-chunk
# keeps what came, and the learner's memory is this many times snapshot_chunks_queued_max.
snapshot_piece_bytes_max = 1024 * 1024
assert 0 < snapshot_piece_bytes_max <= snapshot_chunk_bytes_max

# --- node API (see docs/node-api.md) -------------------------------------------------------------

# A consume long-poll parks one request; bounded like WAIT_COMMITTED so it never pins memory.
consume_wait_ms_max = 60_000
# Messages in one consume page: a page is built in memory and sent as one reply.
consume_page_entries_max = 10_000
# Time-index samples a consume page with times=1 carries (docs/node-api.md, "Append times"): the
# node sends only samples some message of the page lands on, so at most one per message, plus one
# "unknown past here" marker; a client refuses a reply with more (16 bytes each: 160 KB at most).
consume_page_time_samples_max = consume_page_entries_max + 1
# A snapshot's first page at a tail waits at most this long for the tail's commit point to cover
# what the tail held durably when the request came (read your acks=all writes at the tail: the
# head answered, its COMMIT_POINT is still on its way down), and only while linked upstream.
consume_commit_point_wait_ms = 500
# An acks=all produce is failed with `timeout` after this long without the chain committing it; the
# write may still commit (the outcome is unknown to the producer).
produce_commit_timeout_ms = 30_000
# The opaque consumer-group blob committed with a high-water mark: small cursor state, not data.
group_state_bytes_max = 64 * 1024
# An HTTP request body: one full batch in JSON (which can double binary-safe sizes) plus slack.
http_body_bytes_max = 2 * batch_bytes_max
# A request body this small is parsed on the event loop (~5 ms of JSON); a larger one in a parse
# thread. Inline, a 75 MB produce body held a node's loop ~0.5 s (parse 0.4 s + conversion 0.1 s;
# measured), long enough to make peers' pings late. In a thread the loop still stops for the
# longest single C call (json.loads, the depth scan's regex: they hold the GIL), about half that.
http_body_inline_parse_bytes_max = 1024 * 1024
# Threads that parse large bodies: their own, so parsing never takes a commit worker; more large
# bodies wait their turn (each holds up to http_body_bytes_max of memory while it waits anyway).
http_parse_threads_max = 2
# Nesting of a JSON request body, checked by a scan before it is parsed (Python's parser recurses
# per level and would fail with RecursionError near 1,000). The deepest valid body is 4 levels
# ({"messages": [{"headers": {...}}]}); 32 leaves room for new fields, not for a stack bomb.
json_depth_max = 32
# Entries a group's lag reply scans (this queue's entries in (hwm, boundary], counted in a worker
# thread): ~0.5 s at the storage bench's scan rate. Past it the reply says the count is a floor.
group_lag_scan_entries_max = 1_000_000
# Consumer groups one shard holds (each a high-water mark and perhaps a state blob in the shard's
# replicated metadata, which a link's METADATA frame carries whole, at most frame_meta_entries_max
# keys): a commit that would add one more is refused. It also bounds the series a scrape of
# /metrics and the groups GET /v1/status?groups=1 report per shard.
groups_per_shard_max = 1_000
# Entries one computation of every group's lag on a node looks at, over all its groups (a scrape of
# /metrics, GET /v1/status?groups=1), in a worker thread: ~0.1 s at the storage bench's scan rate
# (the 2 M entries/s group_lag_scan_entries_max assumes), so a 15 s scrape interval costs under 1%
# of a core. Groups closest to their boundary are counted first; past it a group's figures are
# estimates that err high (docs/node-api.md, "Metrics").
group_lag_metrics_scan_entries_max = 200_000
# A replica's time index (lag in seconds, kayos/replication/logic/timeindex.py) notes the first
# seq it accepts in each interval of this many ms: a group's lag_seconds is at most this much too
# old, and the produce path pays one compare per batch in between.
time_index_interval_ms = 1_000
# Samples one replica keeps (16 bytes each, in memory and in its file: 1 MiB): at one a second,
# 18 hours of non-stop writes (an idle shard takes none). Older messages have an unknown age.
time_index_samples_max = 65_536
# How often a replica writes its time index file, when it changed: what a crash loses becomes
# unknown (never wrong); rarer means fewer whole-file writes off the produce path.
time_index_persist_interval_ms = 10_000
# Delay before a replica retries its upstream link, doubling up to the max: a restarting upstream
# comes back within seconds, and a retry storm must not eat the CPU the live chain needs.
link_retry_delay_ms_min = 50
link_retry_delay_ms_max = 1_000

# Recently committed batches a replica keeps in memory so its links forward them without reading
# them back from the store: enough for every link's in-flight window, bounded in bytes.
replica_recent_batches_max = 1024
replica_recent_bytes_max = 64 * 1024 * 1024
# A commit this small, with nothing queued behind it, runs on the node's event loop instead of a
# worker thread: it blocks the loop for about one fdatasync (~0.3 ms here), less than the two
# thread hand-offs it saves cost in latency.
inline_commit_entries_max = 16

# A member below the head writes its commit point (what a tail may show consumers) into its local
# metadata this often (and when its node stops), if it moved: a tail restarted after a crash
# serves what was committed up to about this long before, and the rest once its upstream tells
# it. Rarer means fewer metadata commits (one small fsync each).
commit_point_persist_interval_ms = 1000

# How often a node looks at its stores' garbage ratios to start a background compaction: often
# enough that a busy shard's file never grows far past the ratio, rare enough to cost nothing.
compaction_check_interval_ms = 5_000
# Retention (docs/retention.md). How often a head decides its queues' retention floors (and each
# replica looks whether to compact for them): an entry outlives its policy by about this much
# (plus the compaction below). A decision that moves no floor commits nothing.
retention_check_interval_ms = 200
# A replica compacts for retention when a floor in its metadata rose and either its file grew by
# as much as the compaction left (and by retention_compaction_growth_bytes_min) since the last
# one, or this long passed: each compaction rewrites the live data, so the growth rule keeps the
# rewriting to about one copy of what is written, and the time rule catches slow queues.
retention_compaction_interval_ms = 2_000
retention_compaction_growth_bytes_min = 1024 * 1024
# Floors a head commits in one metadata write (a shard with more queues whose floor rose in one
# round takes several writes): well inside frame_meta_entries_max and one meta chunk.
retention_floor_changes_per_commit_max = 1_000
# The head counts a queue's bytes (for max_bytes) in buckets of at most this many entries, the
# granularity at which it drops them: a queue keeps at most one bucket over its max_bytes.
retention_bucket_entries_max = 1_000
# A head keeps at most this many buckets per queue in memory (16 bytes each; over it, adjacent
# buckets are merged, coarsening the granularity rather than growing).
retention_buckets_max = 100_000
# Disk space a store leaves free (docs/retention.md, "Disk full"): a commit that would leave less
# fails with disk_full before it writes a byte. The derived index (lmdb, mapped writable) and the
# successor map grow pages through memory maps, where a full disk is a SIGBUS rather than an
# error; the reserve keeps room for their growth. Compaction may use half of it, so that a
# retention compaction can still write its (small) new file and free the old one on a full disk.
disk_reserve_bytes = 32 * 1024 * 1024
# A head refuses a batch (disk_full, before it takes a seq or goes down the chain) when less than
# the reserve plus this margin plus twice the batch's payload is free: the commits already on their
# way (group commit) then still fit, so a full disk refuses new writes without breaking the chain's
# history (a commit failing at the head itself makes it start a new history).
disk_head_margin_bytes = 8 * 1024 * 1024
# While a head's disk is full (a commit failed with ENOSPC) it retries starting a new history this
# often, so writes resume by themselves within this bound once space is freed.
disk_full_retry_ms = 500

# A node compacts a store again only after its log moved on by this fraction of the rollback window
# (1/N of it): what compaction may drop grows only as seqs leave the window.
compaction_window_fraction = 10
# A node's garbage-collector thresholds (generation 0 allocations, then collections of the younger
# generation before an older one is collected). CPython's default (700, 10, 10) walks the node's
# cache of recent batches many times a second; this keeps cycle collection rare and short.
gc_thresholds = (50_000, 20, 100)

assert consume_page_entries_max <= scan_page_entries_max
assert consume_page_time_samples_max >= consume_page_entries_max + 1, "a full page's samples fit"
assert 4 <= json_depth_max < 500, "every valid body fits; far below Python's recursion limit"
assert link_retry_delay_ms_min <= link_retry_delay_ms_max

# --- local supervision (`kayos up`, kayos/local/supervisor.py)  -----------------------------------

# Before `kayos up` starts a node (or its Kestrel front) that died, doubling from the min to the
# max with each death in a row: a node killed by accident is back within a second, and one that
# dies at once on every start (a bad data directory) does not spin the CPU the others need.
node_restart_delay_ms_min = 250
node_restart_delay_ms_max = 30_000
# A node that ran this long before it died was healthy: its next restart waits the min again.
node_restart_healthy_ms = 60_000
# A write that comes while its shard's replica is being re-made on this node (a topology change
# closes and opens it) waits this long for it before it is answered ``unavailable``: a re-make
# takes tens of milliseconds (one store close and open, a takeover entry's fsync), a few hundred
# on a busy disk; past that the client's own retry takes over.
node_change_wait_ms = 1_000
# Deaths in a row (each within node_restart_healthy_ms of its start) after which `kayos up` stops
# restarting and stops the cluster: with the delays above, about two minutes of trying, long
# enough for a full disk or a held port to clear and short enough that a broken node is reported.
node_restarts_max = 10

assert 0 < node_restart_delay_ms_min <= node_restart_delay_ms_max
assert node_restart_healthy_ms > node_restart_delay_ms_max
assert node_restarts_max >= 1

# --- cluster manager (kayos/manager/, docs/manager.md) -------------------------------------------

# A stall any healthy node may have now and then, in ms: a collection pause, a busy shared machine
# (two cores, several processes), a page swapped back in. The chaos schedule stalls nodes this long
# every few seconds, and no such stall may remove a node (docs/manager.md, "Evidence and proof of
# death").
manager_stall_ms_tolerated = 300
# A node not heard from (no poll answer, no watch beat) for this long is declared down and spliced
# out of every chain: the freeze bound, since a dead process is found at once by proof (the
# manager's watch and probe, docs/manager.md). More than twice the tolerated stall plus one poll
# interval (a stall begins up to one beat after the last one heard, and the node's answers after it
# may wait for the next round), so a stall is never a removal, and a node frozen for good is out in
# ~0.8 s. Above the link silence bound: its neighbours' links to it close (and report) first.
manager_detection_window_ms = 700
# A node silent this long is marked suspect (shown in status, nothing removed): half the window.
manager_suspect_after_ms = manager_detection_window_ms // 2
# A node whose p99 produce-path latency, as measured by a chain neighbour, stays above this over a
# window of manager_slow_window_ms is removed as slow. 250 ms is ~50x a healthy loopback or LAN hop
# with fsync on an SSD, so only a node that is really stuck (paused, swapping, a dying disk)
# crosses it; one slow fsync does not move a p99.
manager_slow_p99_ms = 250
# "Stays above" means: of a neighbour's latency buckets (latency_bucket_ms) in the last
# manager_slow_window_ms, at least manager_slow_buckets_min, and two thirds of those holding
# samples, have their p99 over the bound. 1.5 s keeps the removal of a slow node under issue 11's
# 3 s with the poll and the splice; a single pause or GC stall, answered all at once, fills one
# bucket and removes nobody.
manager_slow_window_ms = 1_500
manager_slow_buckets_min = 2
# The default minimum replica count of a shard: below it the manager raises an alert, and a slow
# node that would take a shard below it stays in the chain (docs/manager.md).
manager_min_replicas_default = 2
# Nodes and shards one manager view holds: the view is replicated and hashed on every change.
manager_nodes_max = 1_000
manager_shards_max = 10_000

assert 0 < manager_suspect_after_ms < manager_detection_window_ms
assert manager_detection_window_ms > peer_silence_ms_max, "links to a frozen node close first"
assert 0 < manager_slow_p99_ms < manager_slow_window_ms
assert manager_slow_buckets_min >= 2
assert manager_min_replicas_default >= 1

# --- the manager process (kayos/manager/member/, docs/manager.md "Running it")  -------------------

# How often the leader polls every node's GET /v1/status: one Raft entry per round, so 10 entries
# a second (pysyncobj commits far more asynchronously); a silent node is found within the
# detection window plus one interval. A round waits this long for answers, not for the slowest.
manager_poll_interval_ms = 100
# One status poll or admin message to a node: a node slower than this is not heard by that poll.
# Below the suspect bound, so one slow answer never makes a node suspect; a watch probe that gets
# no answer within it leaves the node to the window.
manager_request_timeout_ms = 300
# The node's beat on the manager's watch (GET /v1/admin/watch, docs/node-api.md): each line counts
# as the node heard, so a frozen node's silence is measured from at most one beat before it froze.
# One a round: a line of ~60 bytes per node per 100 ms.
manager_watch_beat_ms = 100
# The least time between two probes of one node by the leader (a watch that ended, a report from a
# node or client): reports are unsigned, and must not make the leader flood a node with connects.
manager_probe_interval_ms_min = 50
# Watches one node serves at once (GET /v1/admin/watch): the leader keeps one; a leader replaced
# while frozen may hold another until its connection dies, and a few leader changes in a row a few
# more. Each costs a task and a line per beat. One past it is answered 503.
node_watchers_max = 16
# A node reports a chain neighbour whose link was reset, refused or closed (POST
# /v1/manager/suspect) at most this often: a link that fails again and again as it retries must
# not flood the managers (each report is one probe at most, and probes are bounded too).
node_suspect_report_interval_ms_min = 100
# A stopping node waits at most this long for its watches to take their goodbye line before it
# stops its HTTP port: a watcher that does not read (a frozen leader) must not hold the stop.
node_goodbye_ms_max = 500
# Raft election timeouts (pysyncobj raftMinTimeout/raftMaxTimeout). Measured on this machine with
# pysyncobj 0.3.17: 0.15-0.45 s gives leader failover in 0.6-0.8 s (defaults 0.4-1.4 s: 1.3-1.8 s).
manager_raft_min_timeout_ms = 150
manager_raft_max_timeout_ms = 450
# The leader's Raft heartbeat (appendEntriesPeriod): under a third of the least election timeout, so
# a follower hears a live leader several times before it would call an election.
manager_raft_heartbeat_ms = 40
# Members of one manager group: 3 or 5 in practice (a majority must live); 1 for tests.
manager_members_max = 7
# A learner whose durable_seq is this close to the tail's is caught up: it joins the chain as
# tail and its upstream link's handshake copies the last few entries (writes go on meanwhile).
manager_catchup_done_lag_seqs = 1_000
# A catch-up order the node does not act on (it does not report the shard as a learner) is sent
# again after this long; also the least time between two topology re-sends to one node.
manager_resend_interval_ms = 1_000
# A node removed as slow returns after answering this many polls in a row within slow_p99_ms
# (2 s at the default interval): a node that is still stuck does not flap back in.
manager_slow_return_polls = 10
# A node the manager holds `full` (its disk is full: rule 9, docs/manager.md) returns once it
# reports its disk not full with at least this many bytes free beyond its reserve
# (disk_reserve_bytes): twice the margin at which it reports full (disk_head_margin_bytes), so a
# node that just gets under the mark does not flap back in and fill again on its catch-up.
manager_disk_return_margin_bytes = 2 * disk_head_margin_bytes
# How long a member waits for its own log entry to be applied (remove-node, the leader-change
# entry) before answering `timeout`.
manager_apply_timeout_ms = 5_000
# (entries applied, view hash) pairs each member keeps for GET /v1/manager/status, so members'
# views can be compared at the same entry while the leader keeps logging.
manager_hash_history = 64
# Chain changes (one per epoch: the shards' chains and pending moves after it) each member keeps
# for GET /v1/manager/changes, so an operator or a test can see every epoch a drain or rebalance
# went through, not only those a poll happened to catch. A record is ~100 bytes per shard; 1,024
# epochs cover hours of normal running and any one operation on a test cluster.
manager_change_history_epochs = 1_024
# Events in one Raft log entry: one poll round's (a tick, returns, latency reports, catch-ups)
# stays far below it; an entry past it is refused before it is logged.
manager_entry_events_max = 10_000
# A request body to a manager member (POST /v1/manager/remove-node: a node id and a MAC).
manager_request_bytes_max = 4_096
# Raft log entries kept before pysyncobj compacts them into the dump file.
manager_log_compaction_entries = 5_000
# A host name in an operator's AddNode (kayos ctl add-node): DNS names are at most 253 characters.
manager_node_host_chars_max = 253

assert 0 < manager_request_timeout_ms < manager_suspect_after_ms
assert 0 < manager_poll_interval_ms < manager_suspect_after_ms
assert manager_detection_window_ms >= 2 * manager_stall_ms_tolerated + manager_poll_interval_ms, (
    "a tolerated stall, even two back to back, and the round after it is not a removal"
)
assert 0 < manager_watch_beat_ms * 3 <= manager_suspect_after_ms, "several beats per suspect bound"
assert 0 < manager_probe_interval_ms_min <= manager_poll_interval_ms
assert node_watchers_max > manager_members_max, "every member may have led once"
assert 0 < node_suspect_report_interval_ms_min <= manager_poll_interval_ms
assert 0 < node_goodbye_ms_max < http_shutdown_ms_max
assert 0 < manager_raft_heartbeat_ms * 3 < manager_raft_min_timeout_ms  # pysyncobj requires it
assert manager_raft_min_timeout_ms < manager_raft_max_timeout_ms
assert manager_members_max >= 3
assert manager_slow_return_polls >= 1
assert manager_change_history_epochs >= 1

# --- head leases (docs/manager.md "Head leases", docs/replication-protocol.md "Confirming") ------

# A node holds a read lease for this long from the local monotonic time it answered a manager
# poll, once the leader's Raft-committed answer to that poll names an epoch the node holds. Half
# the detection window: measured from before the leader heard the node, a lease ends 350 ms before
# the manager can call a silent node down, far more than any clock rate drift could eat (a
# factor of two); and three and a half poll rounds long, so one or two slow rounds do not let a
# healthy head's lease lapse. A head serves confirmations (and its own snapshots) only while it
# holds one; a head that took a shard over from another node holds its writes at most this long
# after adopting the change (the old head's lease ends first; the leader shortens it to what may
# be left, 0 when the old head's lease is proven over, docs/manager.md).
head_lease_ms = manager_detection_window_ms // 2
# A node hands out a new lease nonce (GET /v1/status "lease_nonce") at most this often, reusing
# the newest one in between: an older nonce starts the lease earlier, never later, so reuse is
# safe, and a flood of status requests cannot push the leader's nonce out of the table below.
lease_nonce_interval_ms = 50
# Nonces a node remembers (with the time each was handed out): at one per interval this covers
# 3.2 s, past a whole lease, so the leader's answer always finds its nonce.
lease_nonces_max = 64
# Lease answers at epochs a node has not adopted yet that it keeps until it does (the newest):
# the answer of the round that logged a change races the change's topology to the node, and one
# kept answer is enough to bridge that; a few cover answers of rounds logged back to back.
lease_early_grants_max = 4
# A member answers at most this many CONFIRMs of one downstream link at a time; past it, a CONFIRM
# is answered "not held" at once (a downstream sends one per wave of snapshot requests).
link_confirms_pending_max = 64

assert 0 < head_lease_ms < manager_detection_window_ms - 2 * manager_poll_interval_ms
assert head_lease_ms > 3 * manager_poll_interval_ms, "a lease outlives two lost grant rounds"
assert lease_nonces_max * lease_nonce_interval_ms > head_lease_ms
assert link_confirms_pending_max >= 1
assert lease_early_grants_max >= 1

# --- topology changes (docs/node-api.md, "Topology changes") -----------------------------------

# A node starting asks each peer's GET /v1/topology for a newer signed topology, all at once, for
# at most this long: a peer that is itself starting answers late or not at all, and a node must
# not wait on it (its own file and DATA/topology.json are enough to start).
topology_peer_query_ms_max = 500
# A signed topology (POST /v1/admin/topology, DATA/topology.json, a peer's reply) is at most this
# big: ~1 KB per node and per shard chain leaves room for thousands of each.
topology_bytes_max = 4 * 1024 * 1024
# Per chain neighbour, a node keeps its PING/PONG round trips and ACK delays of the last
# latency_window_ms (GET /v1/status "latency"): long enough to hold the manager's slow window,
# short enough that a node that recovered stops looking slow soon after.
latency_window_ms = 10_000
# ... and at most this many samples per neighbour (the oldest go first): an ACK per batch under
# load would otherwise grow the window without bound. 4096 still puts 40 samples above a p99.
latency_samples_max = 4096
# The manager's slow rule looks at the p99 of each bucket of latency_bucket_ms, so that a burst
# of fast samples from before a node turned slow does not hide it (a 10 s p99 over thousands of
# earlier ACKs took 0.5-5.6 s to cross the bound). Half a second holds one PING round trip of an
# idle link (ping_interval_ms) and, for a node that stalls again and again, at least one of its
# returns; one GC pause fills one bucket, not a window of them.
latency_bucket_ms = 500
# ... and the last this many whole buckets are reported: 6 s holds the longest slow window a
# manager may be configured with by default and then some.
latency_buckets = 12
# ... keeping per bucket at most this many of its largest samples: its p99 is exact up to 100
# times that many samples in a quarter second (25,600, ~100k a second, far past one link's
# batches); past it, the smallest kept sample, at or above the p99.
latency_bucket_top_max = 256

# GET /v1/topology?after=E&wait_ms=W waits at most this long for a newer topology: a watcher asks
# again as soon as it is answered, so a quiet cluster costs each watcher one request per 30 s, and
# a request that outlives a proxy's idle bound (commonly 60 s) is answered before it is cut.
topology_watch_wait_ms_max = 30_000
# Requests waiting in GET /v1/topology?after= at one node at once (each connected client keeps one
# per node it watches): each holds a socket and a small handler task, so 4,096 of them are a few
# MiB and well under the descriptors a node process is given; one more is answered 503 at once.
topology_watchers_max = 4_096
# ... and a waiting request whose asker hung up (a client closed, a short-lived command) is let go
# within this, so a burst of clients that come and go does not fill the bound above for a whole
# wait; a check per waiter per second costs nothing.
topology_watch_hangup_check_ms = 1_000

assert latency_window_ms >= manager_slow_window_ms
assert latency_samples_max >= 100
assert latency_bucket_ms * latency_buckets >= manager_slow_window_ms
assert latency_bucket_top_max >= 1
assert 0 < topology_peer_query_ms_max < handshake_ms_max
assert topology_watch_wait_ms_max > 0
assert topology_watchers_max >= 1
assert 0 < topology_watch_hangup_check_ms < topology_watch_wait_ms_max

# --- client (kayos/client/) ----------------------------------------------------------------------

# Attempts of one client operation against `unavailable` and connection failures (the first try
# included): with the delays below they span ~6 s, enough for a node restart or a chain repair to
# finish, and short enough that a dead cluster is reported rather than waited on for ever.
client_retry_attempts_max = 10
# Backoff before a retry doubles from the min to the max, with jitter (half fixed, half random) so
# many clients retrying after one failure do not arrive together again.
client_retry_delay_ms_min = 25
client_retry_delay_ms_max = 1_000
# `wrong_role` redirects followed by one operation: each refreshes the topology, so more than a
# few in a row means the cluster is mid-change and the operation is reported, not chased.
client_redirects_max = 5
# A reply to one request (produce, wait, page) must come within this long: longer than the node's
# own acks=all bound, so a slow commit is reported by the node as `timeout`, not guessed at here.
client_request_timeout_ms = produce_commit_timeout_ms + 5_000
# Opening a TCP connection and its HELLO handshake; a live node on a LAN answers in milliseconds.
client_connect_timeout_ms = 5_000
# A consumer refreshes its cached topology when it is older than this as it starts a snapshot, so a
# queue that gained shards (kayos ctl queue alter) is read whole within this long: one GET
# /v1/topology per known node every 10 s at most.
client_topology_max_age_ms = 10_000
# Requests one client keeps in flight on one binary connection: the node stops reading past its own
# bound, so a higher one would only queue in socket buffers.
client_in_flight_requests_max = connection_in_flight_requests_max
# HTTP connections the client's session keeps open to all nodes together.
client_http_connections_max = 64
# A client's connection with requests outstanding that has heard nothing from its node (no reply,
# no PING: nodes ping every ping_interval_ms) for this long is given up as lost, and its requests
# are sent again once the topology changes (docs/node-api.md, "Clients"). One manager detection
# window: a node silent that long is one the manager is splicing out, so a shorter bound would give
# up on nodes the manager keeps (a stall), and a longer one would leave requests on a frozen node
# after the cluster moved on. Also how long a request whose connection failed waits for the
# manager's new topology before it is sent again anyway.
client_silence_ms = manager_detection_window_ms
# Nodes (and seeds) one client's watch long-polls at once (GET /v1/topology?after=): any live node
# gives a new topology as soon as it adopts it, and the manager sends it to every node, so a few
# watched nodes suffice; a client of a large cluster holds no more than this many requests open.
client_topology_watch_nodes_max = 16

# --- kayos ctl (kayos/cli/ctl/) -------------------------------------------------------------------

# `kayos ctl status` waits this long for each node's reply by default: a live node answers a status
# in milliseconds, and a paused or partitioned one must not hold the report up for long.
ctl_status_timeout_ms_default = 2_000
# kayos ctl drain / move-shard / rebalance follow the manager's moves until done: how long at most
# by default (a move copies a whole shard, throttled by the catch-up bound), and how often they ask.
# Interrupting leaves the plan running in the manager; a re-run follows it again.
ctl_operation_wait_ms_default = 3_600_000
ctl_progress_poll_ms = 500  # also kayos ctl compact's and queue create/alter's progress polls
# Tries of an operator request whose epoch went stale between reading the view and posting it.
ctl_operator_tries_max = 5
# A link that is up but whose downstream is more entries behind than this is an alert
# (`link_lagging`): ten times what `kayos bench produce` keeps in flight (128 batches of 100), so
# a busy healthy chain stays under it and a member that fell behind for seconds does not.
ctl_link_lag_alert_entries = 100_000

assert client_retry_attempts_max >= 1
assert 0 < client_retry_delay_ms_min <= client_retry_delay_ms_max
assert client_request_timeout_ms > produce_commit_timeout_ms
assert client_in_flight_requests_max <= connection_in_flight_requests_max
assert client_silence_ms >= 3 * ping_interval_ms, "one lost or late PING never trips it"
assert client_silence_ms < client_request_timeout_ms
assert client_topology_watch_nodes_max >= 1
assert 0 < ping_interval_ms * 3 <= peer_silence_ms_max
assert peer_silence_ms_max < produce_commit_timeout_ms
assert 0 < ctl_status_timeout_ms_default < client_request_timeout_ms
assert ctl_link_lag_alert_entries > 0

# `kayos ctl queue create/alter` waits this long by default for every node to run the topology
# with the queue's new shard count: the manager publishes it at once (one Raft commit, one signed
# POST per node) and re-sends to nodes behind every manager_resend_interval_ms.
ctl_queue_apply_timeout_ms_default = 30_000
assert ctl_queue_apply_timeout_ms_default > 0

# `kayos ctl compact` (POST /v1/admin/compact) and `kayos ctl check` (docs/operations.md).
# How long `kayos ctl compact` waits for every store it asked for by default: a compaction copies
# the live data once, about 100 MB/s on a loaded disk, so 10 minutes covers a store of tens of GB.
ctl_compact_timeout_ms_default = 600_000
# `kayos ctl check` waits this long for one digest or online store check: a store walk reads the
# whole file (up to online_store_check_bytes_max), a minute or more on a busy disk.
ctl_check_read_timeout_ms_default = 300_000
# A node keeps the outcome of this many compactions asked for by an operator (oldest dropped first),
# for the CLI's progress polls: more than any node holds shards.
admin_compaction_jobs_kept_max = 256
# `GET /v1/shards/{s}/digest` hashes at most this many seqs per request: a bounded read (~100 ms of
# a thread for small entries) however long the shard's log is; `kayos ctl check` digests the last
# seqs below the common commit point.
shard_digest_seqs_max = 100_000
# `GET /v1/shards/{s}/check` walks the live store's tree (every chunk's CRC) only up to this file
# size: the same bound a node's open uses (store_verify_on_open_bytes_max); a larger store is
# reported as not checked, never read for minutes on a live node.
online_store_check_bytes_max = store_verify_on_open_bytes_max
# Digests and store checks one node runs at once for `kayos ctl check` requests: each reads a store
# in a worker thread; more would only take disk time from the node's commits.
online_check_reads_concurrent_max = 2

assert ctl_compact_timeout_ms_default > 0
assert ctl_check_read_timeout_ms_default > 0
assert admin_compaction_jobs_kept_max > 0
assert shard_digest_seqs_max > 0
assert online_store_check_bytes_max > 0
assert online_check_reads_concurrent_max > 0

# --- the host: directory locks and listening ports (docs/node-api.md "Owners, locks and ports") -

# A lock file holds its owner's pid in decimal and a newline; reading more than this for an error
# message would only read garbage someone else wrote there.
lock_file_pid_bytes_max = 32

# --- the Spark data source (docs/spark.md) -------------------------------------------------------

# Rows per page a Spark partition reads from a tail; each page becomes one Arrow record batch.
# The node's page bound, so a range is read in as few round trips as the node allows.
spark_read_page_rows_default = consume_page_entries_max
# How long a range read or a planning step waits for a tail whose commit point has not reached
# the range's end (a fanout tail a round trip behind, a tail restarted and catching up) before the
# task fails with UnavailableError (Spark retries it).
spark_range_catch_up_ms = 10_000
# Rows per produce batch a Spark writer task sends: large enough that one fsync round covers
# thousands of rows, far below batch_entries_max so a batch of 100-byte rows stays a few MiB.
spark_write_batch_rows = 5_000
# Produce batches a writer task keeps in flight to one head (pipelined on one connection): enough
# to overlap the chain's fsyncs with the next batch's encoding.
spark_write_in_flight_batches = 4

assert 0 < spark_read_page_rows_default <= consume_page_entries_max
assert 0 < spark_write_batch_rows <= batch_entries_max
assert 0 < spark_write_in_flight_batches <= client_in_flight_requests_max
assert spark_range_catch_up_ms > 0

# --- chaos testing (chaos/, docs/testing.md) ----------------------------------------------------

# Seeds one `kayos chaos sim` call runs: about an hour of the simulator at ~30 seeds/s; a longer
# run is several calls with different --seed, each replayable on its own.
chaos_sim_seeds_max = 100_000

# --- queues over several shards (docs/node-api.md, "Queues over several shards") --------------

# Shards of the second queue `kayos bench produce --queue-shards N` measures: each is a chain of
# `replicas` node processes' stores on this machine, and 64 of them already outnumber the cores
# and file descriptors a bench run should take (the topology itself bounds S by its shard count).
bench_queue_shards_max = 64

assert bench_queue_shards_max >= 1

# --- idempotent producers (docs/node-api.md, "Idempotent producers") ----------------------------

# Calls of one producer a shard's head de-duplicates: the window of its highest producer_seqs,
# each with its seqs. A resend comes from a call still in flight, so the client starts a call to
# a shard only while the oldest one in flight there is less than this behind it
# (kayos/client/producer.py): every resend stays within the window, and a client has at most this
# many calls in flight per shard. 64 calls of 100 messages keep the produce benchmark's chain
# busy, and cover every thread of a shared blocking Client. Each entry is 24 bytes of the
# producer's metadata value, which every write of that producer rewrites.
producer_window_entries = 64
# Producer ids one shard's head remembers; recording one more forgets the producer written least
# recently (its metadata key deleted in the same batch). The windows are replicated metadata,
# which a link's first batch and METADATA carry whole in one frame and a store commit that
# changes metadata rewrites whole: 1000 full windows (~1.6 MB) fit the 8 MiB of metadata room
# frame_bytes_max leaves past a batch with room to spare for the other keys, 10,000 would not.
producers_per_shard_max = 1_000

assert producer_window_entries >= 1
assert 1 <= producers_per_shard_max <= frame_meta_entries_max // 4, (
    "the producer windows leave most of a frame's metadata keys to groups and retention"
)
# A window's key is "prod/" and 32 hex digits, its value 24 bytes per entry.
assert (
    producers_per_shard_max * (37 + 24 * producer_window_entries)
    <= (frame_bytes_max - batch_bytes_max) // 4
), "every window of a shard fits a quarter of a frame's metadata room"
# A group takes two metadata keys (its mark and its state): every group and producer window of a
# shard fit a frame's metadata keys with half of them left to retention and the store's own.
assert 2 * groups_per_shard_max + producers_per_shard_max <= frame_meta_entries_max // 2, (
    "a shard's groups and producer windows fit half of a METADATA frame's keys"
)
assert group_lag_metrics_scan_entries_max <= group_lag_scan_entries_max

# --- Redundancy restored by itself (docs/manager.md rule 10) ------------------------------------
# How long a shard stays short of its replication factor before the manager copies it to another
# node, in ms (the default of the manager's `replace_after_ms`; 0 there turns replacement off).
# Five minutes covers a node's restart and a host's reboot (one to three minutes on a cloud
# instance) and a rolling upgrade's step, which come back by themselves and catch up only what
# they missed; a whole-store copy for them would be wasted I/O. It is short against the hours a
# second failure of the same shard takes on average, which is what redundancy guards against.
manager_replace_after_ms = 300_000
# Replacements (whole-store copies to a new member) running at once across the cluster. Each one
# reads a tail's store file and writes the target's, at disk speed: a lost host holding a
# hundred shards would otherwise start a hundred copies at once, starve the surviving tails'
# disks and network of the produce traffic they serve, and finish no copy sooner than four at a
# time would (the copies share the same disks and links). Shards with the fewest replicas go
# first.
manager_restores_max = 4

assert manager_replace_after_ms >= manager_detection_window_ms
assert manager_restores_max >= 1
# --- kayos bench scale (docs/performance.md, "Scale-out on capped nodes") ----------------------
# A node's CPU cap, in cores. Below 0.05 core (5 ms in each 100 ms period) a Python node spends
# its share on its own timers and never saturates on messages; above one core a cap means nothing
# to a node whose event loop runs on one core at a time.
bench_scale_node_cpu_min = 0.05
bench_scale_node_cpu_max = 1.0
# The bench's cgroup's CPU weight, in multiples of the kernel's default: 100 x the default is
# cgroup v2's ceiling (cpu.weight 10000), and far past what any load on a test box calls for.
bench_scale_weight_max = 100

assert 0 < bench_scale_node_cpu_min < bench_scale_node_cpu_max
assert bench_scale_weight_max >= 1

# --- client identities and roles (kayos/auth/, docs/security.md) --------------------------------
# A client credential's secret: random bytes, an HMAC-SHA256 key's own size. It is generated, never
# chosen by a person, so its strength is in its length; the PBKDF2 below only slows a guess at a
# stolen table further.
credential_secret_bytes = 32
credential_salt_bytes = 16
# PBKDF2-HMAC-SHA256 rounds from a secret to its stored key: a client pays them once per process
# (about 25 ms on this project's 2-core box), a node never (it checks proofs against the stored
# key). A table may name more, never fewer.
credential_pbkdf2_rounds_min = 50_000
# A credential's name: printable ASCII without spaces or commas (it travels in a header).
credential_name_chars_max = 64
# Credentials in one table, grants per credential, and secrets a credential holds at once (two:
# the old and the new during a rotation).
credentials_max = 1_000
credential_grants_max = 32
credential_secrets_max = 2
# An HTTP request's proof carries the client's clock; a node takes it within this much of its own
# (either way). Wide enough for hosts kept by NTP (milliseconds apart), narrow enough that a
# replayed request has to be replayed soon, while its nonce is still remembered.
auth_clock_skew_ms_max = 60_000
# Nonces a node remembers to refuse a replayed proof; past this the oldest are forgotten and every
# proof at or before the newest forgotten one's time is refused as stale (never a replay let in).
# 200,000 entries at ~210 bytes each in CPython (measured: ~127 for the ordered dict's entry and
# its int, ~81 for the 32-character key) are ~42 MB, and hold two minutes of 1,600 proved HTTP
# requests a second.
auth_nonces_max = 200_000
# Refusals written to the node's log per minute; the rest are counted only
# (kayos_auth_refusals_total counts every one): a stranger knocking in a loop must not fill the
# disk with log lines.
auth_refusal_log_lines_per_minute_max = 20
# The credentials table's encoded size (JSON): what a node reads from its data directory and what
# POST /v1/admin/credentials takes. 1,000 credentials of 2 secrets and a few grants fit in ~600 KB.
credentials_table_bytes_max = 2 * 2**20
# A manager member reads the nodes' credentials table again, when a request needs it, once its
# copy is this old: a credential added or removed reaches the managers' faces within 5 s, and a
# busy face asks a node at most once per 5 s.
manager_credentials_refresh_ms = 5_000

assert credential_secret_bytes >= 32
assert credential_salt_bytes >= 16
assert credential_secrets_max == 2, "a rotation holds the old and the new secret, no more"
assert auth_refusal_log_lines_per_minute_max >= 1

# --- The copy pacer's own measurements and the copy's rate ceiling (docs/performance.md, "Pacing
# a copy"; docs/operations.md, "A copy's rate ceiling") ---
# Besides a live-rate drop, a window with live traffic cuts the copy's share when the member's
# mean store commit (fsync included) took more than this many times its mean before the copy, and
# at least copy_pace_commit_slack_ms more: 2x is the disk queueing the copy's I/O ahead of the
# chain's fsyncs; the slack keeps sub-millisecond fsyncs (page-cache-backed virtual disks) from
# cutting a copy over noise.
copy_pace_commit_rise_max = 2.0
copy_pace_commit_slack_ms = 5.0
# A window in which the member's own process spent this share of one core on CPU
# (time.process_time) does not grow the share (it holds): the event loop that serves live traffic
# runs on one core, so past 0.9 of it there is no room for more copy work. Not a cut: a node busy
# before the copy would otherwise hold every copy at the floor while live work did not slow.
copy_pace_cpu_share_max = 0.9
# The default of a node's copy_rate_mb_per_s_max (`kayos node --copy-rate-mb-per-s-max`): the
# bytes per second (MB = 10^6 bytes) any one copy this node serves or writes may reach, whatever
# its share. 0: no ceiling (the pacer's share alone bounds it while live traffic flows; an idle
# shard is copied as fast as the disk and CPU go).
copy_rate_mb_per_s_max = 0.0

assert copy_pace_commit_rise_max > 1
assert copy_pace_commit_slack_ms >= 0
assert 0 < copy_pace_cpu_share_max <= 1
assert copy_rate_mb_per_s_max >= 0

# --- TLS (docs/security.md, "TLS") ---------------------------------------------------------------
# A refused TLS handshake (plain TCP on a TLS port, a foreign or expired certificate) is logged at
# most once per this many ms per reason: a scanner or a misconfigured client retrying in a loop
# must not flood the log, and one line a second still shows the operator what is happening.
tls_refusal_log_ms = 1_000
# The TLS handshake of a connection on the binary port must end within this many ms, else the
# connection is closed: 5 s is ~1000x a loopback handshake and ~50x one across a WAN, and bounds
# how long a silent peer holds one of limits.handshake_connections_max slots.
tls_handshake_ms_max = 5_000
