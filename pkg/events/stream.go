package events

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"syscall"
	"time"

	zmq "github.com/pebbe/zmq4"
	"github.com/zeebo/xxh3"
)

// endSeq marks the end of a replay (-1 as 8 big-endian bytes).
const endSeq = ^uint64(0)

// drainMax bounds the messages taken from one socket per poll, so that a
// flooding publisher cannot starve the stream's timers.
const drainMax = 1024

// ringSize is how many recent (sequence, fingerprint) pairs a stream keeps
// to tell a late duplicate from an engine restart.
const ringSize = 1024

type ringEntry struct {
	seq uint64
	fp  uint64
	ok  bool
}

type liveMsg struct {
	seq     uint64
	payload []byte
}

// stream owns one source's sockets and its sequence state. Only its own
// goroutine touches it.
type stream struct {
	m    *Manager
	rep  *replica
	zctx *zmq.Context
	q    chan item
	log  *slog.Logger

	sub *zmq.Socket

	have       bool   // next is meaningful
	next       uint64 // the sequence number expected next
	ring       [ringSize]ringEntry
	quietSince time.Time // set while catching up by the quiet window
	// awaiting is set from session start until the first connection: the
	// warm replay waits for it, so that nothing published between the
	// replay and the subscription taking effect is missed.
	awaiting      bool
	awaitDeadline time.Time
	lost          bool
}

func (s *stream) cfg() *Config { return &s.m.cfg }

func (s *stream) setState(state string) { s.rep.set(func(r *replica) { r.state = state }) }

// run keeps a session alive until ctx ends, backing off between failures.
func (s *stream) run(ctx context.Context) {
	attempt := 0
	for {
		start := s.cfg().Now()
		err := s.session(ctx)
		if ctx.Err() != nil {
			return
		}
		if s.cfg().Now().Sub(start) > s.cfg().BackoffMax {
			attempt = 0
		}
		d := backoff(s.cfg().BackoffMin, s.cfg().BackoffMax, attempt)
		attempt++
		s.setState("backoff")
		s.log.Warn("event stream failed; retrying", slog.Any("error", err), slog.Duration("retry_in", d))
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// backoff is min·2^attempt capped at max, with jitter in [d/2, d].
func backoff(lo, hi time.Duration, attempt int) time.Duration {
	d := hi
	if attempt < 30 {
		d = min(hi, lo<<attempt)
	}
	half := d / 2
	return half + time.Duration(rand.Int64N(int64(half)+1))
}

func isAgain(err error) bool { return zmq.AsErrno(err) == zmq.Errno(syscall.EAGAIN) }

func isIntr(err error) bool { return zmq.AsErrno(err) == zmq.Errno(syscall.EINTR) }

// session opens the SUB socket (and its monitor), warms up, and follows the
// live stream until ctx ends or a socket fails.
func (s *stream) session(ctx context.Context) (err error) {
	src := s.rep.src
	sub, err := s.zctx.NewSocket(zmq.SUB)
	if err != nil {
		return fmt.Errorf("sub socket: %w", err)
	}
	defer func() { _ = sub.Close() }()
	for _, set := range []error{
		sub.SetLinger(0),
		sub.SetRcvhwm(100000),
		sub.SetMaxmsgsize(s.cfg().MaxMessageBytes),
		sub.SetReconnectIvl(s.cfg().BackoffMin),
		sub.SetReconnectIvlMax(s.cfg().BackoffMax),
		sub.SetSubscribe(src.Topic),
	} {
		if set != nil {
			return fmt.Errorf("sub options: %w", set)
		}
	}
	monAddr := fmt.Sprintf("inproc://kvroute-events-monitor-%d", s.m.monSeq.Add(1))
	if err := sub.Monitor(monAddr, zmq.EVENT_CONNECTED|zmq.EVENT_ACCEPTED|zmq.EVENT_DISCONNECTED); err != nil {
		return fmt.Errorf("monitor: %w", err)
	}
	defer func() { _ = sub.Monitor("", 0) }()
	mon, err := s.zctx.NewSocket(zmq.PAIR)
	if err != nil {
		return fmt.Errorf("monitor socket: %w", err)
	}
	defer func() { _ = mon.Close() }()
	if err := mon.SetLinger(0); err != nil {
		return fmt.Errorf("monitor options: %w", err)
	}
	if err := mon.Connect(monAddr); err != nil {
		return fmt.Errorf("monitor connect: %w", err)
	}
	endpoint := src.Endpoint
	if src.Listen {
		if err := sub.Bind(src.Endpoint); err != nil {
			return fmt.Errorf("bind %s: %w", src.Endpoint, err)
		}
		if ep, err := sub.GetLastEndpoint(); err == nil {
			endpoint = ep
		}
	} else if err := sub.Connect(src.Endpoint); err != nil {
		return fmt.Errorf("connect %s: %w", src.Endpoint, err)
	}
	s.rep.set(func(r *replica) { r.endpoint = endpoint })
	s.sub = sub
	s.lost = false
	s.log.Info("event stream opened", slog.String("endpoint", endpoint), slog.Bool("listen", src.Listen))

	// Until the engine is connected the view is empty and incomplete.
	s.reset(ctx)
	s.awaiting, s.awaitDeadline = true, s.cfg().Now().Add(s.cfg().ReplayTimeout)
	s.setState("connecting")
	poller := zmq.NewPoller()
	poller.Add(mon, zmq.POLLIN) // connection events first
	poller.Add(sub, zmq.POLLIN)
	for ctx.Err() == nil {
		polled, err := poller.Poll(s.cfg().PollInterval)
		if err != nil {
			if isIntr(err) {
				continue
			}
			return fmt.Errorf("poll: %w", err)
		}
		for _, p := range polled {
			if p.Socket == mon {
				s.drainMonitor(ctx, mon)
			} else {
				s.drainLive(ctx)
			}
		}
		s.tick(ctx)
	}
	return nil
}

func (s *stream) drainMonitor(ctx context.Context, mon *zmq.Socket) {
	for range drainMax {
		ev, _, _, err := mon.RecvEvent(zmq.DONTWAIT)
		if err != nil {
			return
		}
		switch ev {
		case zmq.EVENT_DISCONNECTED:
			if !s.lost {
				s.lost = true
				s.log.Warn("event stream disconnected")
			}
		case zmq.EVENT_CONNECTED, zmq.EVENT_ACCEPTED:
			reason := "reconnect"
			switch {
			case s.awaiting:
				reason = "connect"
			case !s.lost:
				continue // another connection without a loss: nothing missed
			}
			s.awaiting, s.lost = false, false
			s.warm(ctx, reason)
		}
	}
}

// parseFrames splits a live message [topic, seq, payload].
func parseFrames(frames [][]byte) (seq uint64, payload []byte, ok bool) {
	if len(frames) != 3 || len(frames[1]) != 8 {
		return 0, nil, false
	}
	return binary.BigEndian.Uint64(frames[1]), frames[2], true
}

func (s *stream) drainLive(ctx context.Context) {
	for range drainMax {
		frames, err := s.sub.RecvMessageBytes(zmq.DONTWAIT)
		if err != nil {
			if !isAgain(err) {
				s.log.Debug("event receive failed", slog.Any("error", err))
			}
			return
		}
		seq, payload, ok := parseFrames(frames)
		if !ok {
			s.m.met.decodeErrors.WithLabelValues(string(s.rep.src.ID), "frames").Inc()
			continue
		}
		s.rep.noteEvent(s.cfg().Now())
		s.live(ctx, liveMsg{seq, payload}, true)
		if ctx.Err() != nil {
			return
		}
	}
}

// live handles one live batch in sequence order.
func (s *stream) live(ctx context.Context, msg liveMsg, allowReplay bool) {
	if !s.have {
		s.have, s.next = true, msg.seq
		if msg.seq == 0 && !s.rep.caughtUp.Load() {
			// Seen from the publisher's first batch: nothing was missed.
			s.caughtUp("stream_from_zero")
		}
	}
	switch {
	case msg.seq == s.next:
		if !s.trySend(msg) {
			s.rep.met.overflows.Inc()
			s.log.Warn("event queue full; resyncing replica")
			s.warm(ctx, "overflow")
		}
	case msg.seq > s.next:
		s.rep.met.gaps.Inc()
		if allowReplay && s.rep.src.ReplayEndpoint != "" {
			s.replayFrom(ctx, s.next, false, []liveMsg{msg})
			return
		}
		s.fallback(ctx, "gap")
		s.live(ctx, msg, false)
	default:
		if s.isDup(msg) {
			return
		}
		s.log.Info("sequence went backwards; engine restarted", slog.Uint64("seq", msg.seq), slog.Uint64("expected", s.next))
		s.warmWith(ctx, "restart", []liveMsg{msg})
	}
}

func fingerprint(p []byte) uint64 {
	return xxh3.Hash(p[:min(len(p), 64)]) ^ uint64(len(p))
}

func (s *stream) record(msg liveMsg) {
	s.ring[msg.seq%ringSize] = ringEntry{seq: msg.seq, fp: fingerprint(msg.payload), ok: true}
	s.next = msg.seq + 1
	s.rep.set(func(r *replica) { r.hasSeq, r.lastSeq = true, msg.seq })
}

// isDup reports whether msg is a batch already applied (a live copy arriving
// after its replayed twin), as opposed to a restarted engine reusing the
// sequence number with a different batch.
func (s *stream) isDup(msg liveMsg) bool {
	e := s.ring[msg.seq%ringSize]
	return e.ok && e.seq == msg.seq && e.fp == fingerprint(msg.payload)
}

func (s *stream) batchItem(msg liveMsg) item {
	return item{rep: s.rep, kind: itemBatch, epoch: s.rep.epoch.Load(), payload: msg.payload}
}

// trySend queues a live batch without waiting.
func (s *stream) trySend(msg liveMsg) bool {
	select {
	case s.q <- s.batchItem(msg):
		s.record(msg)
		return true
	default:
		return false
	}
}

// send queues an item, waiting for room (replayed batches and resets: the
// stream is paced by its worker, never the router).
func (s *stream) send(ctx context.Context, it item) bool {
	select {
	case s.q <- it:
		return true
	case <-ctx.Done():
		return false
	}
}

// clear starts a new epoch: queued batches of the old one are skipped and
// the worker clears the replica. The view is incomplete until caught up.
func (s *stream) clear(ctx context.Context, reason string) {
	s.reset(ctx)
	if s.rep.caughtUp.Swap(false) {
		s.log.Info("replica resyncing", slog.String("reason", reason))
	}
	s.m.met.resyncs.WithLabelValues(string(s.rep.src.ID), reason).Inc()
	s.rep.set(func(r *replica) { r.reason, r.state = reason, "resyncing" })
}

// reset starts a new, empty epoch without counting a resync.
func (s *stream) reset(ctx context.Context) {
	e := s.rep.epoch.Add(1)
	s.send(ctx, item{rep: s.rep, kind: itemReset, epoch: e})
	s.have = false
	s.quietSince = time.Time{}
	s.rep.caughtUp.Store(false)
	s.rep.met.resyncing.Set(1)
}

func (s *stream) caughtUp(how string) {
	s.quietSince = time.Time{}
	if !s.rep.caughtUp.Swap(true) {
		s.log.Info("replica caught up", slog.String("via", how))
	}
	s.rep.met.resyncing.Set(0)
	s.setState("live")
}

// startQuiet makes the replica catch up after ResyncQuiet of gap-free live
// events.
func (s *stream) startQuiet() {
	s.quietSince = s.cfg().Now()
	s.setState("resyncing")
}

// fallback clears the replica and waits for the quiet window: replay is
// not configured, failed, or could not cover what was missed.
func (s *stream) fallback(ctx context.Context, reason string) {
	s.clear(ctx, reason)
	s.startQuiet()
}

// warm clears the replica and relearns it from the oldest batch the engine
// still buffers (connect, reconnect, restart, overflow).
func (s *stream) warm(ctx context.Context, reason string) { s.warmWith(ctx, reason, nil) }

func (s *stream) warmWith(ctx context.Context, reason string, pending []liveMsg) {
	defer s.rep.settled.Store(true)
	if s.rep.src.ReplayEndpoint == "" {
		s.fallback(ctx, reason)
		for _, msg := range pending {
			s.live(ctx, msg, false)
		}
		return
	}
	s.clear(ctx, reason)
	s.replayFrom(ctx, 0, true, pending)
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

// maxReplayRounds bounds how many times one catch-up re-asks for batches
// that went missing while it was replaying.
const maxReplayRounds = 3

// replayFrom asks the replay endpoint for every batch from start, applies
// them, then applies the live batches that arrived meanwhile (pending plus
// those buffered during the replay), deduplicated by sequence. full means
// the replica was just cleared and start is 0: a complete replay catches it
// up.
func (s *stream) replayFrom(ctx context.Context, start uint64, full bool, pending []liveMsg) {
	s.setState("replaying")
	for round := 0; ; round++ {
		res, err := s.replayOnce(ctx, start, &pending)
		s.m.met.replays.WithLabelValues(string(s.rep.src.ID), res.String()).Inc()
		if ctx.Err() != nil {
			return
		}
		switch res {
		case replayFailed:
			s.log.Warn("replay failed", slog.Any("error", err), slog.Uint64("from", start))
			s.fallback(ctx, "replay_failed")
			for _, msg := range pending {
				s.live(ctx, msg, false)
			}
			return
		case replayTruncated:
			s.log.Warn("replay started later than asked; engine buffer moved on", slog.Uint64("from", start))
			s.startQuiet()
			full = false
		}
		// Merge the live batches that arrived meanwhile.
		gapAt := -1
		for i, msg := range pending {
			if s.have && msg.seq < s.next {
				continue
			}
			if !s.have {
				s.have, s.next = true, msg.seq
			}
			if msg.seq > s.next {
				gapAt = i
				break
			}
			if !s.send(ctx, s.batchItem(msg)) {
				return
			}
			s.record(msg)
		}
		if gapAt < 0 {
			if full {
				s.caughtUp("replay")
			} else if s.quietSince.IsZero() && s.rep.caughtUp.Load() {
				s.setState("live")
			} else if !s.quietSince.IsZero() {
				s.setState("resyncing")
			}
			return
		}
		s.rep.met.gaps.Inc()
		pending = pending[gapAt:]
		start = s.next
		if round+1 >= maxReplayRounds {
			s.fallback(ctx, "replay_rounds")
			for _, msg := range pending {
				s.live(ctx, msg, false)
			}
			return
		}
	}
}

var errReplayTimeout = errors.New("replay timed out")

// replayOnce runs one replay request on a fresh DEALER. Replayed batches
// are queued as they arrive; live batches are appended to pending.
func (s *stream) replayOnce(ctx context.Context, start uint64, pending *[]liveMsg) (replayResult, error) {
	dealer, err := s.zctx.NewSocket(zmq.DEALER)
	if err != nil {
		return replayFailed, fmt.Errorf("dealer socket: %w", err)
	}
	defer func() { _ = dealer.Close() }()
	for _, set := range []error{
		dealer.SetLinger(0),
		dealer.SetRcvhwm(0),
		dealer.SetMaxmsgsize(s.cfg().MaxMessageBytes),
		dealer.SetSndtimeo(s.cfg().ReplayTimeout),
	} {
		if set != nil {
			return replayFailed, fmt.Errorf("dealer options: %w", set)
		}
	}
	if err := dealer.Connect(s.rep.src.ReplayEndpoint); err != nil {
		return replayFailed, fmt.Errorf("connect %s: %w", s.rep.src.ReplayEndpoint, err)
	}
	var req [8]byte
	binary.BigEndian.PutUint64(req[:], start)
	if _, err := dealer.SendMessage([]byte{}, req[:]); err != nil {
		return replayFailed, fmt.Errorf("replay request: %w", err)
	}
	poller := zmq.NewPoller()
	poller.Add(dealer, zmq.POLLIN)
	poller.Add(s.sub, zmq.POLLIN)
	deadline := s.cfg().Now().Add(s.cfg().ReplayTimeout)
	first, truncated := true, false
	for {
		if ctx.Err() != nil {
			return replayFailed, ctx.Err()
		}
		wait := min(s.cfg().PollInterval, deadline.Sub(s.cfg().Now()))
		if wait <= 0 {
			return replayFailed, errReplayTimeout
		}
		polled, err := poller.Poll(wait)
		if err != nil {
			if isIntr(err) {
				continue
			}
			return replayFailed, fmt.Errorf("poll: %w", err)
		}
		for _, p := range polled {
			if p.Socket == s.sub {
				if err := s.bufferLive(pending); err != nil {
					return replayFailed, err
				}
				continue
			}
			for range drainMax {
				frames, err := dealer.RecvMessageBytes(zmq.DONTWAIT)
				if err != nil {
					if isAgain(err) {
						break
					}
					return replayFailed, fmt.Errorf("replay receive: %w", err)
				}
				deadline = s.cfg().Now().Add(s.cfg().ReplayTimeout)
				seq, payload, ok := parseReply(frames)
				if !ok {
					s.m.met.decodeErrors.WithLabelValues(string(s.rep.src.ID), "replay_frames").Inc()
					continue
				}
				if seq == endSeq {
					if first && !s.have {
						// Nothing published yet: the stream starts at
						// start, and anything later is a gap.
						s.have, s.next = true, start
					} else if first {
						// Nothing is buffered from start on: what was
						// missed is gone.
						s.clear(ctx, "replay_truncated")
						return replayTruncated, nil
					}
					if truncated {
						return replayTruncated, nil
					}
					return replayOK, nil
				}
				if first {
					first = false
					if !s.have {
						s.have, s.next = true, start
					}
				}
				if seq < s.next {
					continue // already applied
				}
				if seq > s.next {
					// The engine no longer buffers what we asked for, or
					// dropped replies: the view has a hole.
					truncated = true
					s.clear(ctx, "replay_truncated")
					s.have, s.next = true, seq
				}
				msg := liveMsg{seq, payload}
				if !s.send(ctx, s.batchItem(msg)) {
					return replayFailed, ctx.Err()
				}
				s.record(msg)
			}
		}
	}
}

// parseReply accepts both replay framings after the DEALER's empty
// delimiter: [topic, seq, payload] (vLLM >= 0.26) and [seq, payload].
func parseReply(frames [][]byte) (seq uint64, payload []byte, ok bool) {
	if len(frames) > 0 && len(frames[0]) == 0 {
		frames = frames[1:]
	}
	switch len(frames) {
	case 3:
		frames = frames[1:]
	case 2:
	default:
		return 0, nil, false
	}
	if len(frames[0]) != 8 {
		return 0, nil, false
	}
	return binary.BigEndian.Uint64(frames[0]), frames[1], true
}

// bufferLive moves live batches into pending while a replay runs.
func (s *stream) bufferLive(pending *[]liveMsg) error {
	for range drainMax {
		frames, err := s.sub.RecvMessageBytes(zmq.DONTWAIT)
		if err != nil {
			return nil
		}
		seq, payload, ok := parseFrames(frames)
		if !ok {
			s.m.met.decodeErrors.WithLabelValues(string(s.rep.src.ID), "frames").Inc()
			continue
		}
		s.rep.noteEvent(s.cfg().Now())
		if len(*pending) >= s.cfg().ReplayBuffer {
			s.rep.met.overflows.Inc()
			return errors.New("live buffer full during replay")
		}
		*pending = append(*pending, liveMsg{seq, payload})
	}
	return nil
}

// tick runs the stream's timers: worker-requested resyncs, the quiet
// window, and the silence flag.
func (s *stream) tick(ctx context.Context) {
	now := s.cfg().Now()
	if s.awaiting && !s.rep.settled.Load() && !now.Before(s.awaitDeadline) {
		// The engine is not reachable: do not hold readiness back. The
		// replica stays at Credit 0 until it connects.
		s.rep.settled.Store(true)
		s.log.Warn("engine not connected; replica stays cold until it is", slog.Duration("waited", s.cfg().ReplayTimeout))
	}
	if s.rep.needResync.Swap(false) {
		s.fallback(ctx, "decode_error")
	}
	if !s.quietSince.IsZero() && now.Sub(s.quietSince) >= s.cfg().ResyncQuiet {
		s.caughtUp("quiet_window")
	}
	silent := s.rep.silentAt(now, s.cfg().SilentAfter)
	var changed bool
	s.rep.set(func(r *replica) { changed, r.silent = r.silent != silent, silent })
	if changed {
		if silent {
			s.rep.met.silent.Set(1)
			s.log.Warn("replica receives requests but publishes no KV events; check prefix caching and kv-events config",
				slog.Duration("window", s.cfg().SilentAfter))
		} else {
			s.rep.met.silent.Set(0)
			s.log.Info("replica publishes KV events again")
		}
	}
}
