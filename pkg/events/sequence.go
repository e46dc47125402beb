package events

import (
	"time"

	"github.com/zeebo/xxh3"
)

// This file is the sequencing state machine: which batches to apply, when
// to clear a replica, when to ask for a replay, when the view counts as
// caught up. It reads no socket and no clock: the subscriber feeds it what
// happened (a live batch, a replay reply, a connection, a tick) with the
// time, and carries out the actions it returns, in order.

// ringSize is how many recent (sequence, fingerprint) pairs are kept to tell
// a late duplicate from an engine restart.
const ringSize = 1024

// maxReplayRounds bounds how many times one catch-up re-asks for batches
// that went missing while it was replaying.
const maxReplayRounds = 3

type ringEntry struct {
	seq uint64
	fp  uint64
	ok  bool
}

// liveMsg is one batch: its sequence number and undecoded payload.
type liveMsg struct {
	seq     uint64
	payload []byte
}

func fingerprint(p []byte) uint64 {
	return xxh3.Hash(p[:min(len(p), 64)]) ^ uint64(len(p))
}

// seqState is the machine's state, reported by ReplicaStatus.State.
type seqState uint8

const (
	// stIdle: no session yet.
	stIdle seqState = iota
	// stConnecting: a session is open and waits for the engine's
	// connection before it warms up.
	stConnecting
	// stReplaying: a replay request is outstanding; live batches are
	// buffered until it ends.
	stReplaying
	// stResyncing: the view is incomplete (cleared, replay not possible
	// or not complete); the quiet window may be running.
	stResyncing
	// stLive: batches are applied as they come.
	stLive
)

func (s seqState) String() string {
	switch s {
	case stConnecting, stIdle:
		return "connecting"
	case stReplaying:
		return "replaying"
	case stResyncing:
		return "resyncing"
	}
	return "live"
}

type replayResult uint8

const (
	replayOK replayResult = iota
	replayTruncated
	replayFailed
)

func (r replayResult) String() string {
	switch r {
	case replayOK:
		return "ok"
	case replayTruncated:
		return "truncated"
	}
	return "failed"
}

type actKind uint8

const (
	// actEnqueue: queue msg for the worker in the current epoch. A live
	// batch must not wait: if the queue is full, report Overflow. Others
	// wait for room.
	actEnqueue actKind = iota
	// actClear: start a new epoch; the worker clears the replica. A
	// non-empty reason counts a resync.
	actClear
	// actReplay: ask the replay endpoint for every batch from `from`,
	// on a fresh connection (replacing any replay in progress), and feed
	// its replies to ReplayBatch / ReplayEnd / ReplayFailed.
	actReplay
	// actCaughtUp: the view is complete (how says why).
	actCaughtUp
	// actGap: a sequence gap was seen (metric).
	actGap
	// actReplayDone: a replay request ended with result (metric, log).
	actReplayDone
	// actRestart: the sequence went backwards: the engine restarted (log).
	actRestart
	// actReplayOverflow: a live batch found the replay buffer full (metric).
	actReplayOverflow
	// actUnreachable: the engine did not connect in time; readiness is no
	// longer held back (log).
	actUnreachable
)

// action is one step the subscriber carries out.
type action struct {
	kind   actKind
	msg    liveMsg // actEnqueue; actRestart: the batch that went backwards
	live   bool    // actEnqueue: never wait
	reason string  // actClear, actCaughtUp
	from   uint64  // actReplay; actRestart: the sequence expected
	result replayResult
}

// seqConfig is what the machine needs to know of its source and Config.
type seqConfig struct {
	replay       bool          // the source has a replay endpoint
	connectWait  time.Duration // how long a session waits for the engine before settling
	replayBuffer int           // live batches buffered during a replay
	resyncQuiet  time.Duration // gap-free window that catches up an unreplayable replica
}

// replayRun is an outstanding catch-up.
type replayRun struct {
	start     uint64
	full      bool // the replica was cleared and start is 0: success catches it up
	round     int
	first     bool // no reply yet in this round
	truncated bool
	pending   []liveMsg // live batches that arrived meanwhile
}

// sequencer is the pure state machine of one event stream. Not safe for
// concurrent use: its subscriber goroutine owns it.
type sequencer struct {
	cfg seqConfig

	state    seqState
	reason   string // why the replica last resynced
	caughtUp bool
	settled  bool // the first warm-up attempt finished
	warming  bool // the replay running is a warm-up: settles when it ends

	have    bool   // next is meaningful
	next    uint64 // the sequence expected next
	hasSeq  bool
	lastSeq uint64 // last sequence queued
	ring    [ringSize]ringEntry

	quietSince time.Time // non-zero while catching up by the quiet window
	// awaiting is set from session start until the engine connects: the
	// warm replay waits for it, so that nothing published between the
	// replay and the subscription taking effect is missed.
	awaiting      bool
	awaitDeadline time.Time
	lost          bool // disconnected since the last connection

	rp  *replayRun
	out []action
	now time.Time
}

func newSequencer(cfg seqConfig) *sequencer { return &sequencer{cfg: cfg} }

func (q *sequencer) emit(a action) { q.out = append(q.out, a) }

// begin starts a step at now; done returns the step's actions (valid until
// the next step).
func (q *sequencer) begin(now time.Time) { q.out, q.now = q.out[:0], now }

func (q *sequencer) done() []action { return q.out }

// Start: a session opened. The view is emptied and stays incomplete until
// the engine connects and the warm-up is done.
func (q *sequencer) Start(now time.Time) []action {
	q.begin(now)
	q.rp, q.warming = nil, false
	q.reset()
	q.awaiting, q.awaitDeadline, q.lost = true, now.Add(q.cfg.connectWait), false
	q.state = stConnecting
	return q.done()
}

// Disconnected: the connection to the engine was lost. It reports whether
// this is news (the first loss since the last connection).
func (q *sequencer) Disconnected() bool {
	news := !q.lost
	q.lost = true
	return news
}

// Connected: the connection to the engine is (re-)established. The first
// connection of a session and any reconnection after a loss warm up
// (clear, replay from 0); another connection without a loss changes
// nothing.
func (q *sequencer) Connected(now time.Time) []action {
	q.begin(now)
	reason := "reconnect"
	switch {
	case q.awaiting:
		reason = "connect"
	case !q.lost:
		return q.done()
	}
	q.awaiting, q.lost = false, false
	q.warmWith(reason, nil)
	return q.done()
}

// Live: a batch arrived on the live stream.
func (q *sequencer) Live(now time.Time, msg liveMsg) []action {
	q.begin(now)
	if q.rp != nil {
		if len(q.rp.pending) >= q.cfg.replayBuffer {
			q.emit(action{kind: actReplayOverflow})
			q.replayFailed()
			return q.done()
		}
		q.rp.pending = append(q.rp.pending, msg)
		return q.done()
	}
	q.live(msg, true)
	return q.done()
}

// Overflow: a live batch could not be queued (the worker is behind). The
// actions left of the step that queued it must be dropped.
func (q *sequencer) Overflow(now time.Time) []action {
	q.begin(now)
	q.warmWith("overflow", nil)
	return q.done()
}

// DecodeError: the worker lost a batch to decoding (replaying it would
// fetch the same bytes): clear and wait for the quiet window.
func (q *sequencer) DecodeError(now time.Time) []action {
	q.begin(now)
	q.fallback("decode_error")
	return q.done()
}

// Tick runs the timers: the connection deadline of the first warm-up and
// the quiet window.
func (q *sequencer) Tick(now time.Time) []action {
	q.begin(now)
	if q.awaiting && !q.settled && !now.Before(q.awaitDeadline) {
		// The engine is not reachable: do not hold readiness back. The
		// replica stays at Credit 0 until it connects.
		q.settled = true
		q.emit(action{kind: actUnreachable})
	}
	if !q.quietSince.IsZero() && now.Sub(q.quietSince) >= q.cfg.resyncQuiet {
		q.caughtUpVia("quiet_window")
	}
	return q.done()
}

// ReplayBatch: the replay endpoint sent batch seq.
func (q *sequencer) ReplayBatch(now time.Time, msg liveMsg) []action {
	q.begin(now)
	rp := q.rp
	if rp == nil {
		return q.done()
	}
	if rp.first {
		rp.first = false
		if !q.have {
			q.have, q.next = true, rp.start
		}
	}
	switch {
	case msg.seq < q.next:
		return q.done() // already applied
	case msg.seq > q.next:
		// The engine no longer buffers what was asked for, or dropped
		// replies: the view has a hole.
		rp.truncated = true
		q.clear("replay_truncated")
		q.have, q.next = true, msg.seq
	}
	q.enqueue(msg, false)
	return q.done()
}

// ReplayEnd: the replay endpoint sent its end marker.
func (q *sequencer) ReplayEnd(now time.Time) []action {
	q.begin(now)
	rp := q.rp
	if rp == nil {
		return q.done()
	}
	res := replayOK
	switch {
	case rp.first && !q.have:
		// Nothing published yet: the stream starts at start, and anything
		// later is a gap.
		q.have, q.next = true, rp.start
	case rp.first:
		// Nothing is buffered from start on: what was missed is gone.
		q.clear("replay_truncated")
		res = replayTruncated
	case rp.truncated:
		res = replayTruncated
	}
	q.emit(action{kind: actReplayDone, result: res, from: rp.start})
	if res == replayTruncated {
		q.startQuiet()
		rp.full = false
	}
	q.merge()
	return q.done()
}

// ReplayFailed: the replay could not be run or timed out.
func (q *sequencer) ReplayFailed(now time.Time) []action {
	q.begin(now)
	if q.rp != nil {
		q.replayFailed()
	}
	return q.done()
}

// Replaying reports whether a replay is outstanding.
func (q *sequencer) Replaying() bool { return q.rp != nil }

func (q *sequencer) replayFailed() {
	rp := q.rp
	q.endReplay()
	q.emit(action{kind: actReplayDone, result: replayFailed, from: rp.start})
	q.fallback("replay_failed")
	for _, msg := range rp.pending {
		q.live(msg, false)
	}
}

// endReplay forgets the outstanding replay; a warm-up is settled.
func (q *sequencer) endReplay() {
	q.rp = nil
	if q.warming {
		q.warming, q.settled = false, true
	}
}

// merge applies the live batches buffered during a replay round, in order
// and deduplicated; a hole among them asks again (bounded rounds).
func (q *sequencer) merge() {
	rp := q.rp
	gapAt := -1
	for i, msg := range rp.pending {
		if q.have && msg.seq < q.next {
			continue
		}
		if !q.have {
			q.have, q.next = true, msg.seq
		}
		if msg.seq > q.next {
			gapAt = i
			break
		}
		q.enqueue(msg, false)
	}
	if gapAt < 0 {
		q.endReplay()
		switch {
		case rp.full:
			q.caughtUpVia("replay")
		case q.quietSince.IsZero() && q.caughtUp:
			q.state = stLive
		default:
			q.state = stResyncing
		}
		return
	}
	q.emit(action{kind: actGap})
	pending := rp.pending[gapAt:]
	if rp.round+1 >= maxReplayRounds {
		q.endReplay()
		q.fallback("replay_rounds")
		for _, msg := range pending {
			q.live(msg, false)
		}
		return
	}
	q.rp = &replayRun{start: q.next, full: rp.full, round: rp.round + 1, first: true, pending: pending}
	q.emit(action{kind: actReplay, from: q.next})
}

// live handles one live batch in sequence order. allowReplay is false for
// batches re-fed after a replay could not cover them.
func (q *sequencer) live(msg liveMsg, allowReplay bool) {
	if q.rp != nil {
		// A replay started while re-feeding: it merges these after.
		q.rp.pending = append(q.rp.pending, msg)
		return
	}
	if !q.have {
		q.have, q.next = true, msg.seq
		if msg.seq == 0 && !q.caughtUp {
			// Seen from the publisher's first batch: nothing was missed.
			q.caughtUpVia("stream_from_zero")
		}
	}
	switch {
	case msg.seq == q.next:
		q.enqueue(msg, true)
	case msg.seq > q.next:
		q.emit(action{kind: actGap})
		if allowReplay && q.cfg.replay {
			q.replayFrom(q.next, false, []liveMsg{msg})
			return
		}
		q.fallback("gap")
		q.live(msg, false)
	default:
		if q.isDup(msg) {
			return
		}
		q.emit(action{kind: actRestart, msg: msg, from: q.next})
		q.warmWith("restart", []liveMsg{msg})
	}
}

func (q *sequencer) enqueue(msg liveMsg, live bool) {
	q.emit(action{kind: actEnqueue, msg: msg, live: live})
	q.ring[msg.seq%ringSize] = ringEntry{seq: msg.seq, fp: fingerprint(msg.payload), ok: true}
	q.next = msg.seq + 1
	q.hasSeq, q.lastSeq = true, msg.seq
}

// isDup reports whether msg is a batch already applied (a live copy arriving
// after its replayed twin), as opposed to a restarted engine reusing the
// sequence number with a different batch.
func (q *sequencer) isDup(msg liveMsg) bool {
	e := q.ring[msg.seq%ringSize]
	return e.ok && e.seq == msg.seq && e.fp == fingerprint(msg.payload)
}

// reset starts a new, empty epoch without counting a resync.
func (q *sequencer) reset() {
	q.emit(action{kind: actClear})
	q.have = false
	q.quietSince = time.Time{}
	q.caughtUp = false
}

// clear starts a new epoch: the view is incomplete until caught up.
func (q *sequencer) clear(reason string) {
	q.emit(action{kind: actClear, reason: reason})
	q.have = false
	q.quietSince = time.Time{}
	q.caughtUp = false
	q.reason, q.state = reason, stResyncing
}

func (q *sequencer) caughtUpVia(how string) {
	q.quietSince = time.Time{}
	q.caughtUp = true
	q.state = stLive
	q.emit(action{kind: actCaughtUp, reason: how})
}

// startQuiet makes the replica catch up after resyncQuiet of gap-free live
// events.
func (q *sequencer) startQuiet() {
	q.quietSince = q.now
	q.state = stResyncing
}

// fallback clears the replica and waits for the quiet window: replay is
// not configured, failed, or could not cover what was missed.
func (q *sequencer) fallback(reason string) {
	q.clear(reason)
	q.startQuiet()
}

// warmWith clears the replica and relearns it from the oldest batch the
// engine still buffers (connect, reconnect, restart, overflow), then
// applies pending.
func (q *sequencer) warmWith(reason string, pending []liveMsg) {
	if !q.cfg.replay {
		q.fallback(reason)
		q.settled = true
		for _, msg := range pending {
			q.live(msg, false)
		}
		return
	}
	q.clear(reason)
	q.warming = true
	q.replayFrom(0, true, pending)
}

func (q *sequencer) replayFrom(start uint64, full bool, pending []liveMsg) {
	if q.rp != nil {
		pending = append(q.rp.pending, pending...)
	}
	q.rp = &replayRun{start: start, full: full, first: true, pending: pending}
	q.state = stReplaying
	q.emit(action{kind: actReplay, from: start})
}
