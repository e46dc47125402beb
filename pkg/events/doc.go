// Package events keeps the index true: it subscribes to every replica's
// KV-cache event stream (vLLM or SGLang, ZMQ PUB + msgpack), decodes the
// batches, and applies them to an index.Index in order, with gap detection,
// replay, restart handling and resync.
//
// # API
//
//	m := events.NewManager(idx, events.Config{...}, registerer, logger)
//	_ = m.SetSources(srcs)  // any time, also before Run; diffed by ID and settings
//	go m.Run(ctx)           // owns every goroutine and socket; returns after joining them
//	m.Credit(id)            // 0 while the replica's view is incomplete, else 1 (hot path, never blocks)
//	m.ViewGaps(id)          // a store below a parent the view did not hold came within index.GapHold (hot path)
//	m.Matcher()             // the index's Match, hybrid replicas' matches cut to their sliding windows
//	m.NoteRouted(id, now)   // the router routed a request there (feeds the silence check)
//	m.Status(id)            // state, last sequence, last event, silent flag, bound endpoint
//	m.Warm()                // every source settled its first warm-up (readiness)
//	m.Readiness()           // Warm, plus which sources are degraded and why (/readyz detail)
//
// Config is the "events" section of kvroute's config file (YAML keys
// workers, queue_size, replay_timeout, ...): zero fields take the Default*
// constants (Config.WithDefaults), and Config.Validate reports every bad
// field by its key. NewManager applies the defaults itself.
//
// The decoder is pure and usable alone: DecodeBatch (or a reusable Decoder)
// turns a payload into a Batch of typed Events; an Applier applies a Batch
// to an index for one Target.
//
// # Wire
//
// A message is three frames: topic, sequence number (8 bytes, unsigned,
// big-endian), msgpack payload; other shapes are counted
// (decode_errors{reason="frames"}) and skipped. The payload is a batch,
// positional [ts, events, data_parallel_rank] (or the two-element form of
// vLLM 0.9.0, or a map with those keys). Events are tagged maps ("type" key,
// fields by name) or tagged positional arrays (tag first, then fields in
// declaration order; shorter and longer arrays are accepted). Unknown event
// types and keys are ignored and counted. Lengths are never trusted: a
// container or string header that claims more than the remaining bytes is
// an error before anything is allocated, and values are skipped without
// recursion.
//
// Block hashes may be uint64, int64 (two's complement bits kept) or bytes.
// Bytes become the last 8 bytes big-endian for vLLM (as vLLM's own integer
// conversion does) and the first 8 for SGLang, left-padded when shorter.
// An integer parent hash of 0 is read as "no parent", as simulators send it.
//
// # Applying events
//
// BlockStored: the index recomputes the router's keys from token_ids with
// the event's block_size (len(token_ids) must equal blocks × block_size,
// else the event is counted as bad_shape and skipped); the parent is found
// through the replica's engine-hash map; medium maps to a tier
// (index.ParseMedium, unknown mediums are counted and skipped); lora_name
// selects the chain root kvblock.Root(model, lora_name). extra_keys are
// turned into kvblock.Options by StoredOptions: the LoRA name is stripped,
// a trailing string in block 0 of a parentless store is the cache salt, and
// the rest is encoded by ExtraBytes; a request hashed with
// kvblock.Options{CacheSalt: salt} therefore meets the keys a salted store
// indexed. Stores whose block size differs from Source.BlockSize are
// indexed as given (group-tagged ones are skipped: see groups.go), counted
// (block_size_mismatch_total) and logged once per replica. medium maps to a tier; locality REMOTE (an offload tier on
// network storage) is held at the disk tier whatever the medium.
// ownership (the secondary tier that produced the event) and session_id
// are decoded and not used: each owner publishes its own stores and
// removals, and the router has its own session key. lora_id is deprecated
// upstream and skipped; lora_name selects the root. lookahead_token_ids
// (vLLM's hash of a block covers the tokens after it) are folded into the
// block's extras (kvblock.AppendLookahead), so only a request hashed with
// kvblock.Options.WithLookahead(tokens, blockSize, n) meets those keys.
//
// KV-cache groups (group_idx, kv_cache_spec_kind,
// kv_cache_spec_sliding_window) are handled per replica by the Applier
// (groups.go has the exact rules): partial-attention kinds (sliding window,
// chunked local, mamba, ...) are not indexed and their removals do not
// reach the index; full_attention, mla_attention and sink_full_attention
// are indexed; an unknown kind is counted (unknown_spec_kind_total) and
// presumed full attention; a group never labelled is presumed full
// attention (vLLM 0.33 labels every store; Source.GroupKinds labels groups
// for publishers that do not). A removal clears only the naming group's
// holding, and reaches the index only when no group holds the hash on that
// tier any more (group_held_total), so a sliding-window group's evictions
// never erase what the full-attention group holds. The stores and removals
// of sliding-window groups (sliding_window, sliding_window_mla) feed the
// Windows view instead (window.go): Manager.Matcher, the router's matcher,
// cuts a hybrid replica's match to the last place its sliding-window group
// holds a window's worth of consecutive blocks, as vLLM's hybrid
// coordinator decides a prefix hit.
// BlockRemoved removes by engine hash and tier; AllBlocksCleared clears the
// replica.
//
// SGLang's page size is its block size: a replica whose configured
// block_size differs from the pages it publishes is warned about once with
// the exact setting to use (block_size: <page size>, or SGLang
// --page-size <block_size>), counted in block_size_mismatch_total, and the
// engine's size is exported as engine_block_size.
//
// # Replica IDs and data parallelism
//
// Each stream is one index.ReplicaID. A data-parallel engine publishes one
// stream per rank on endpoint port + rank (replay endpoint likewise);
// DPSources expands a replica into per-rank sources named DPReplicaID(id,
// rank): the replica's own ID for rank 0 and "<id>#dp<rank>" above, and
// SplitDPReplicaID maps an ID back to its replica and rank.
//
// # Order, gaps, replay, restarts
//
// One goroutine per source (a zmqSubscriber, the socket layer) owns its
// sockets (SUB, a socket monitor, and a DEALER for each replay) and the
// source's sequencer: a pure state machine (sequence.go; no sockets, no
// clock: time is passed in) that is fed what the sockets deliver (live
// batch, replay reply, replay end or failure, connection, loss, tick) and
// answers with actions the subscriber carries out in order (queue a batch,
// clear the replica, ask for a replay, mark it caught up). Batches go, in sequence
// order, to one of a fixed pool of workers chosen by hashing the replica
// ID, so one replica's events are applied in order by one goroutine.
// Worker queues are bounded: a live batch that finds its queue full is
// counted (queue_overflows_total) and resyncs the replica. Replayed batches
// wait for room instead (the replay is paced by the worker, never by the
// router). The index handles concurrent readers, so event handling never
// blocks routing.
//
// The stream expects sequence next = last + 1.
//   - A higher sequence is a gap: the stream asks the replay endpoint for
//     the batches from next (DEALER sending ["", start as 8 bytes]; replies
//     [topic, seq, payload] from vLLM >= 0.26 or [seq, payload] from older
//     vLLM and SGLang, until seq 0xFFFFFFFFFFFFFFFF). Each wait is bounded
//     by ReplayTimeout. Live batches arriving meanwhile are buffered
//     (ReplayBuffer) and applied after, deduplicated by sequence.
//   - A catch-up runs in rounds, each a fresh replay request from the first
//     sequence still missing. vLLM's replay ROUTER keeps libzmq's default
//     send HWM (1000 messages) and drops replies past it, end marker
//     included, so a long replay (a full buffer holds 10,000 batches)
//     arrives in pieces: a reply that skips a sequence after the round has
//     delivered from where it asked, or a pause of 250ms without its end
//     marker once it has delivered (no reply for ReplayTimeout otherwise),
//     ends the round ("partial") and the next round asks from the hole. The
//     worker paces the replay (replayed batches wait for queue room, which
//     does not count as a pause). A full live buffer is dropped and asked
//     for by the next round (the engine buffers those batches too). Only
//     three rounds in a row that apply nothing give up (replay_rounds).
//     Status(id).Replay reports the progress (first and next sequence,
//     rounds, batches replayed, live batches waiting); replays_total
//     {result=partial} and replayed_batches_total count it.
//   - A first reply later than asked means the engine no longer buffers
//     what was missing (its buffer wrapped): the view is cleared and the
//     catch-up ends "truncated", whatever later rounds bring.
//   - A lower sequence that is not a late copy of a batch already applied
//     (same sequence and payload fingerprint) means the engine restarted:
//     the replica is cleared and replayed from 0.
//   - When the connection to the engine is established, and on every
//     reconnect (both seen by the socket monitor), the replica is cleared
//     and replayed from 0, the oldest batch the engine buffers, so a router
//     started after its engines learns what they hold. Waiting for the
//     connection before replaying means nothing published between the
//     replay and the subscription is missed. An engine that does not
//     connect within ReplayTimeout stops holding readiness back (Warm) and
//     stays at Credit 0.
//
// Warm reports that every source finished its first warm-up: its replay
// reached the live stream, or ended truncated or failed, or its engine did
// not connect in time. Readiness adds the detail: how many sources are
// caught up, and each degraded one (Credit 0) with why (warming,
// replaying with progress, unreachable, no_replay_endpoint, or the last
// resync reason such as replay_truncated); the degraded gauge is 1 for a
// source whose warm-up ended without a complete view.
//
// A replica is "caught up", and gets Credit 1, when one of these holds:
// a replay from 0 started at sequence 0 and reached the live stream without
// a hole; the live stream was observed from sequence 0 (a fresh engine);
// or, when replay is not configured, fails, or starts later than asked (the
// engine's buffer moved on), ResyncQuiet has passed since the replica was
// cleared without another gap, and no replay is outstanding (live batches
// wait unapplied in a replay's buffer: whether they follow on without a
// hole is known when it merges them). A replay that goes on after the
// view was cleared mid-way (a batch lost to decoding) brings the replica
// forward but no longer catches it up: what it applied before the clear
// is gone. Until then it is "resyncing": Credit 0, the router treats it as
// cold. Clearing is ordered with the batches through
// the worker queue (a new epoch; batches of the old epoch are skipped).
// A batch that cannot be decoded, or an event with a malformed field,
// withdraws the replica's credit at once (the worker does it), then clears
// the replica and restarts the quiet window (replaying it would fetch the
// same bytes).
//
// A caught-up view can still miss blocks the engine holds: a batch lost
// past a replay that was truncated, or blocks the engine kept through a
// clear of the view and goes on extending (a cached prefix is not stored
// again). The first sign is a store whose parent the view does not hold
// (not indexed, counted in unknown_parent_blocks_total); ViewGaps reports
// such a store within index.GapHold, and the router then credits the
// replicas it sent a resent prompt to (route.ViewGaps). An engine restart
// (its reset, applied by the replica's worker, the mark's one writer) or an
// AllBlocksCleared ends the mark: the engine's cache is then empty.
//
// Socket failures (bind errors, poll errors) reopen the session after a
// capped exponential backoff with jitter (BackoffMin..BackoffMax); TCP
// reconnects inside a session are libzmq's, with the same bounds. A source
// removed from the set has its goroutine stopped, its sockets closed and its
// blocks cleared; a source whose settings change is restarted.
//
// A replica that has been routed requests (NoteRouted) for SilentAfter
// without publishing anything is flagged in Status and in
// kvroute_events_silent: usually prefix caching or KV events are off on the
// engine, or the endpoint or topic is wrong.
//
// # Observability
//
// Metrics, prefixed kvroute_events_ and labelled by replica: batches_total,
// events_total{type}, decode_errors_total{reason}, gaps_total,
// replays_total{result=ok|truncated|failed|partial},
// replayed_batches_total, resyncs_total{reason},
// unknown_parent_blocks_total, skipped_total{reason},
// queue_overflows_total, block_size_mismatch_total,
// unknown_spec_kind_total, group_held_total, engine_block_size,
// lag_seconds, resyncing, degraded, silent; queue_depth{worker}. Logs are structured and emitted on state
// changes only.
//
// # Goroutines
//
// NewManager starts nothing. Run starts Config.Workers workers and one
// goroutine per source, owns a dedicated ZMQ context, and on ctx end
// cancels the sources, joins them (each closes its own sockets), closes and
// joins the workers, and terminates the context before returning. A
// source's socket loop sleeps until a message, its sequencer's next timer,
// or PollInterval at most; the end of its context wakes it through an
// inproc socket in the same poll, sent to by a context.AfterFunc goroutine
// that the session joins before closing it. ZMQ sockets are never shared
// between goroutines.
package events
