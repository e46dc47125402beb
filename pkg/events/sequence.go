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

// maxReplayRounds bounds how many rounds of one catch-up in a row may apply
// nothing before it gives up. A round that makes progress never counts: a
// long replay whose replies the engine drops past its send HWM (vLLM's
// ROUTER keeps libzmq's default of 1000) goes on from where it stopped,
// round after round, until it reaches the live stream.
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
	// replayPartial: the round lost replies (a hole, or no end marker) after
	// making progress; the next round asks from where it stopped.
	replayPartial
)

func (r replayResult) String() string {
	switch r {
	case replayOK:
		return "ok"
	case replayTruncated:
		return "truncated"
	case replayPartial:
		return "partial"
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
	kind     actKind
	msg      liveMsg // actEnqueue; actRestart: the batch that went backwards
	live     bool    // actEnqueue: never wait
	replayed bool    // actEnqueue: a replay reply
	reason   string  // actClear, actCaughtUp
	from     uint64  // actReplay; actRestart: the sequence expected
	result   replayResult
}

// seqConfig is what the machine needs to know of its source and Config.
type seqConfig struct {
	replay       bool          // the source has a replay endpoint
	connectWait  time.Duration // how long a session waits for the engine before settling
	replayBuffer int           // live batches buffered during a replay
	resyncQuiet  time.Duration // gap-free window that catches up an unreplayable replica
}

// replayRun is an outstanding catch-up: one or more rounds (replay
// requests), each asking from the first sequence still missing.
type replayRun struct {
	start      uint64 // this round's first sequence asked for
	from       uint64 // the catch-up's first sequence asked for
	full       bool   // the replica was cleared and from is 0: success catches it up
	idle       int    // rounds in a row that applied nothing
	rounds     int    // rounds so far
	first      bool   // no reply yet in this round
	truncated  bool   // some round found the engine no longer buffers what was missing
	applied    int    // batches applied by this round
	total      int    // batches applied by the catch-up
	overflowed bool   // live batches were dropped from pending: ask again for them
	pending    []liveMsg
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
			// The engine buffers these too: drop them and ask the replay
			// for them once this round ends.
			q.emit(action{kind: actReplayOverflow})
			q.rp.pending = q.rp.pending[:0]
			q.rp.overflowed = true
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

// NextTimer is when Tick next has something to do (the connection
// deadline of the first warm-up, the end of the quiet window); ok is false
// while no timer runs. The quiet window does not end while a replay is
// outstanding (see Tick): its timer waits for the replay.
func (q *sequencer) NextTimer() (at time.Time, ok bool) {
	if q.awaiting && !q.settled {
		at, ok = q.awaitDeadline, true
	}
	if !q.quietSince.IsZero() && q.rp == nil {
		if end := q.quietSince.Add(q.cfg.resyncQuiet); !ok || end.Before(at) {
			at, ok = end, true
		}
	}
	return at, ok
}

// Tick runs the timers: the connection deadline of the first warm-up and
// the quiet window. The quiet window catches the replica up only with no
// replay outstanding: the live batches of its span wait in the replay's
// buffer, unapplied, and whether they follow on without a hole is known
// only when the replay ends and merges them.
func (q *sequencer) Tick(now time.Time) []action {
	q.begin(now)
	if q.awaiting && !q.settled && !now.Before(q.awaitDeadline) {
		// The engine is not reachable: do not hold readiness back. The
		// replica stays at Credit 0 until it connects.
		q.settled = true
		q.emit(action{kind: actUnreachable})
	}
	if !q.quietSince.IsZero() && q.rp == nil && now.Sub(q.quietSince) >= q.cfg.resyncQuiet {
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
	first := rp.first
	if first {
		rp.first = false
		if !q.have {
			q.have, q.next = true, rp.start
		}
	}
	switch {
	case msg.seq < q.next:
		return q.done() // already applied
	case msg.seq > q.next && (first || rp.applied == 0):
		// The engine no longer buffers what was asked for: the view has
		// a hole. The new epoch starts at this batch (enqueue below).
		rp.truncated = true
		q.clear("replay_truncated")
	case msg.seq > q.next:
		// A reply went missing after this round had delivered from
		// where it was asked: the engine still buffers the rest, so
		// ask again from the hole, on a fresh request.
		q.emit(action{kind: actReplayDone, result: replayPartial, from: rp.start})
		q.nextRound()
		return q.done()
	}
	rp.applied++
	rp.total++
	q.enqueue(msg, false)
	q.out[len(q.out)-1].replayed = true
	return q.done()
}

// nextRound asks for the batches from next on a new request, keeping the
// catch-up's pending batches.
func (q *sequencer) nextRound() {
	rp := q.rp
	if rp.applied == 0 {
		rp.idle++
	} else {
		rp.idle = 0
	}
	// truncated stays: a hole found by an earlier round is still a hole.
	rp.start, rp.first, rp.applied = q.next, true, 0
	rp.rounds++
	q.emit(action{kind: actReplay, from: q.next})
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
	case rp.first && q.missedBeyond():
		// Nothing is buffered from start on, yet later batches exist:
		// what was missed is gone.
		q.clear("replay_truncated")
		res = replayTruncated
	case rp.first:
		// Nothing after what was applied (a round that repeats a lost
		// end marker): nothing is missing.
	case rp.truncated:
		res = replayTruncated
	}
	q.emit(action{kind: actReplayDone, result: res, from: rp.start})
	if res == replayTruncated {
		// Every truncation cleared the view (clear: no longer a full
		// catch-up).
		q.startQuiet()
	}
	q.merge()
	return q.done()
}

// ReplayFailed: the replay could not be run or timed out. A round that had
// made progress (its end marker was lost) goes on with another round.
func (q *sequencer) ReplayFailed(now time.Time) []action {
	q.begin(now)
	if rp := q.rp; rp != nil {
		if rp.applied > 0 {
			q.emit(action{kind: actReplayDone, result: replayPartial, from: rp.start})
			q.nextRound()
			return q.done()
		}
		q.replayFailed()
	}
	return q.done()
}

// missedBeyond reports whether batches after next are known to exist (live
// batches buffered during the catch-up, or dropped from that buffer).
func (q *sequencer) missedBeyond() bool {
	rp := q.rp
	if rp.overflowed {
		return true
	}
	for _, m := range rp.pending {
		if m.seq >= q.next {
			return true
		}
	}
	return false
}

// ReplayProgress describes an outstanding catch-up.
type ReplayProgress struct {
	// From is the first sequence the catch-up asked for; Next the first
	// still missing.
	From, Next uint64
	// Rounds is how many replay requests it made so far; Batches how many
	// replayed batches it applied.
	Rounds, Batches int
	// Pending counts live batches waiting for the replay to end.
	Pending int
}

// Progress reports the outstanding catch-up; ok is false when none is.
func (q *sequencer) Progress() (p ReplayProgress, ok bool) {
	rp := q.rp
	if rp == nil {
		return p, false
	}
	return ReplayProgress{From: rp.from, Next: q.next, Rounds: rp.rounds + 1, Batches: rp.total, Pending: len(rp.pending)}, true
}

// RoundApplied is how many batches the current replay round applied.
func (q *sequencer) RoundApplied() int {
	if q.rp == nil {
		return 0
	}
	return q.rp.applied
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
	if rp.overflowed {
		// Live batches were dropped: the engine has them; ask again.
		rp.overflowed = false
		q.emit(action{kind: actGap})
		if q.giveUp() {
			return
		}
		q.nextRound()
		return
	}
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
	rp.pending = rp.pending[gapAt:]
	if q.giveUp() {
		return
	}
	q.nextRound()
}

// giveUp ends a catch-up whose rounds keep applying nothing: the view
// falls back to the quiet window and the pending batches are fed live.
func (q *sequencer) giveUp() bool {
	rp := q.rp
	idle := rp.idle
	if rp.applied == 0 {
		idle++
	}
	if idle < maxReplayRounds {
		return false
	}
	q.endReplay()
	q.fallback("replay_rounds")
	for _, msg := range rp.pending {
		q.live(msg, false)
	}
	return true
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
		q.warmWith(reasonRestart, []liveMsg{msg})
	}
}

// enqueue queues msg in the current epoch: the sequence expected next is
// the one after it, whether or not the epoch had one (a replay going on
// after a clear continues the epoch the clear began).
func (q *sequencer) enqueue(msg liveMsg, live bool) {
	q.emit(action{kind: actEnqueue, msg: msg, live: live})
	q.ring[msg.seq%ringSize] = ringEntry{seq: msg.seq, fp: fingerprint(msg.payload), ok: true}
	q.have, q.next = true, msg.seq+1
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

// clear starts a new epoch: the view is incomplete until caught up. A
// catch-up going on (a replay) goes on into the new epoch, but what it
// brings is no longer everything the engine buffered since the view was
// empty: its success no longer catches the replica up.
func (q *sequencer) clear(reason string) {
	if q.rp != nil {
		q.rp.full = false
	}
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

// reasonRestart is the resync reason of an engine restart (a sequence
// number that went back): the engine's cache is empty.
const reasonRestart = "restart"

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
	q.rp = &replayRun{start: start, from: start, full: full, first: true, pending: pending}
	q.state = stReplaying
	q.emit(action{kind: actReplay, from: start})
}
