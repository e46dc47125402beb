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
)

// endSeq marks the end of a replay (-1 as 8 big-endian bytes).
const endSeq = ^uint64(0)

// drainMax bounds the messages taken from one socket per poll, so that a
// flooding publisher cannot starve the stream's timers.
const drainMax = 1024

// zmqSubscriber is the socket layer of one source: it owns the SUB socket,
// its connection monitor and the replay DEALER, and feeds what they deliver
// to the source's sequencer, carrying out the actions the sequencer returns
// (queueing batches for the worker, clearing, replaying). Only its own
// goroutine touches it.
type zmqSubscriber struct {
	m    *Manager
	rep  *replica
	zctx *zmq.Context
	q    chan item
	log  *slog.Logger

	seq *sequencer
	sub *zmq.Socket
	// wake receives a message when the session's context ends: every
	// poll includes it, so a loop waits for its timers, not for shutdown.
	wake *zmq.Socket
	// replayAt is a replay the sequencer asked for that has not been
	// started yet (replayWant); inReplay is set while one runs.
	replayAt   uint64
	replayWant bool
	inReplay   bool
}

func newZMQSubscriber(m *Manager, rep *replica, zctx *zmq.Context, q chan item) *zmqSubscriber {
	return &zmqSubscriber{
		m: m, rep: rep, zctx: zctx, q: q, log: rep.log,
		seq: newSequencer(seqConfig{
			replay:       rep.src.ReplayEndpoint != "",
			connectWait:  m.cfg.ReplayTimeout,
			replayBuffer: m.cfg.ReplayBuffer,
			resyncQuiet:  m.cfg.ResyncQuiet,
		}),
	}
}

func (s *zmqSubscriber) cfg() *Config { return &s.m.cfg }

func (s *zmqSubscriber) setState(state string) { s.rep.set(func(r *replica) { r.state = state }) }

// run keeps a session alive until ctx ends, backing off between failures.
func (s *zmqSubscriber) run(ctx context.Context) {
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
func (s *zmqSubscriber) session(ctx context.Context) (err error) {
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
	wake, stopWake, err := s.wakeOnDone(ctx)
	if err != nil {
		return err
	}
	defer stopWake()
	s.wake = wake
	s.log.Info("event stream opened", slog.String("endpoint", endpoint), slog.Bool("listen", src.Listen))

	// Until the engine is connected the view is empty and incomplete.
	s.step(ctx, s.seq.Start(s.cfg().Now()))
	poller := zmq.NewPoller()
	poller.Add(mon, zmq.POLLIN) // connection events first
	poller.Add(sub, zmq.POLLIN)
	poller.Add(wake, zmq.POLLIN)
	for ctx.Err() == nil {
		polled, err := poller.Poll(s.idleWait(s.cfg().Now()))
		if err != nil {
			if isIntr(err) {
				continue
			}
			return fmt.Errorf("poll: %w", err)
		}
		for _, p := range polled {
			switch p.Socket {
			case mon:
				s.drainMonitor(ctx, mon)
			case sub:
				s.drainLive(ctx)
			}
		}
		s.tick(ctx)
	}
	return nil
}

// idleWait is how long the live loop may wait for a message: until the
// sequencer's next timer, at most PollInterval, at least a millisecond.
func (s *zmqSubscriber) idleWait(now time.Time) time.Duration {
	d := s.cfg().PollInterval
	if at, ok := s.seq.NextTimer(); ok {
		d = min(d, at.Sub(now))
	}
	return max(d, time.Millisecond)
}

// wakeOnDone binds an inproc PULL socket that receives one message when
// ctx ends. stop joins the goroutine context.AfterFunc may have started
// to send it, then closes the socket. Should the message be lost, the
// loops still see the context at their next timeout.
func (s *zmqSubscriber) wakeOnDone(ctx context.Context) (sock *zmq.Socket, stop func(), err error) {
	addr := fmt.Sprintf("inproc://kvroute-events-wake-%d", s.m.monSeq.Add(1))
	pull, err := s.zctx.NewSocket(zmq.PULL)
	if err != nil {
		return nil, nil, fmt.Errorf("wake socket: %w", err)
	}
	if err := errors.Join(pull.SetLinger(0), pull.Bind(addr)); err != nil {
		_ = pull.Close()
		return nil, nil, fmt.Errorf("wake socket: %w", err)
	}
	sent := make(chan struct{})
	cancel := context.AfterFunc(ctx, func() {
		defer close(sent)
		push, err := s.zctx.NewSocket(zmq.PUSH)
		if err != nil {
			return
		}
		defer func() { _ = push.Close() }()
		if push.SetLinger(0) == nil && push.Connect(addr) == nil {
			_, _ = push.SendBytes([]byte{1}, zmq.DONTWAIT)
		}
	})
	return pull, func() {
		if !cancel() {
			<-sent
		}
		_ = pull.Close()
	}, nil
}

func (s *zmqSubscriber) drainMonitor(ctx context.Context, mon *zmq.Socket) {
	for range drainMax {
		ev, _, _, err := mon.RecvEvent(zmq.DONTWAIT)
		if err != nil {
			return
		}
		switch ev {
		case zmq.EVENT_DISCONNECTED:
			if s.seq.Disconnected() {
				s.log.Warn("event stream disconnected")
			}
		case zmq.EVENT_CONNECTED, zmq.EVENT_ACCEPTED:
			s.step(ctx, s.seq.Connected(s.cfg().Now()))
		}
		if ctx.Err() != nil {
			return
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

func (s *zmqSubscriber) drainLive(ctx context.Context) {
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
		now := s.cfg().Now()
		s.rep.noteEvent(now)
		s.step(ctx, s.seq.Live(now, liveMsg{seq, payload}))
		if ctx.Err() != nil {
			return
		}
	}
}

// step carries out a step's actions, then runs the replays they asked for
// (each replay's replies are fed back to the sequencer, whose actions may
// ask for another round) until none is outstanding.
func (s *zmqSubscriber) step(ctx context.Context, acts []action) {
	s.exec(ctx, acts)
	if s.inReplay {
		return // the running replay returns to the loop below
	}
	for s.replayWant && ctx.Err() == nil {
		s.replayWant = false
		from := s.replayAt
		if err := s.replay(ctx, from); err != nil && ctx.Err() == nil {
			if !errors.Is(err, errReplayIdle) {
				s.log.Warn("replay failed", slog.Any("error", err), slog.Uint64("from", from))
			}
			s.exec(ctx, s.seq.ReplayFailed(s.cfg().Now()))
		}
	}
}

// exec carries out actions in order and publishes the sequencer's state.
// The slice is the sequencer's buffer: it is consumed before the next call
// into the sequencer.
func (s *zmqSubscriber) exec(ctx context.Context, acts []action) {
	defer s.publish()
	id := string(s.rep.src.ID)
	for i := 0; i < len(acts); i++ {
		a := acts[i]
		switch a.kind {
		case actEnqueue:
			if a.live {
				if !s.trySend(a.msg) {
					s.rep.met.overflows.Inc()
					s.log.Warn("event queue full; resyncing replica")
					// The rest of this step assumed the batch was queued.
					acts = s.seq.Overflow(s.cfg().Now())
					i = -1
				}
				continue
			}
			if !s.send(ctx, s.batchItem(a.msg)) {
				return
			}
			if a.replayed {
				s.rep.met.replayed.Inc()
			}
		case actClear:
			e := s.rep.epoch.Add(1)
			s.send(ctx, item{rep: s.rep, kind: itemReset, epoch: e, empty: a.reason == reasonRestart})
			if s.rep.caughtUp.Swap(false) && a.reason != "" {
				s.log.Info("replica resyncing", slog.String("reason", a.reason))
			}
			if a.reason != "" {
				s.m.met.resyncs.WithLabelValues(id, a.reason).Inc()
			}
			s.rep.met.resyncing.Set(1)
		case actReplay:
			s.replayAt, s.replayWant = a.from, true
		case actCaughtUp:
			if !s.rep.caughtUp.Swap(true) {
				s.log.Info("replica caught up", slog.String("via", a.reason))
			}
			s.rep.met.resyncing.Set(0)
		case actGap:
			s.rep.met.gaps.Inc()
		case actReplayDone:
			s.m.met.replays.WithLabelValues(id, a.result.String()).Inc()
			switch a.result {
			case replayTruncated:
				s.log.Warn("replay started later than asked; engine buffer moved on", slog.Uint64("from", a.from))
			case replayPartial:
				if p, ok := s.seq.Progress(); ok {
					s.log.Info("replay round lost replies; asking again from where it stopped",
						slog.Uint64("round_from", a.from), slog.Uint64("next", p.Next), slog.Int("replayed", p.Batches))
				}
			}
		case actRestart:
			s.log.Info("sequence went backwards; engine restarted", slog.Uint64("seq", a.msg.seq), slog.Uint64("expected", a.from))
		case actReplayOverflow:
			s.rep.met.overflows.Inc()
			s.log.Warn("live buffer full during replay", slog.Int("replay_buffer", s.cfg().ReplayBuffer))
		case actUnreachable:
			s.log.Warn("engine not connected; replica stays cold until it is", slog.Duration("waited", s.cfg().ReplayTimeout))
		}
	}
}

// publish copies the sequencer's state to the replica (Status, Warm).
func (s *zmqSubscriber) publish() {
	q := s.seq
	s.rep.set(func(r *replica) {
		r.state = q.state.String()
		if q.reason != "" {
			r.reason = q.reason
		}
		if q.hasSeq {
			r.hasSeq, r.lastSeq = true, q.lastSeq
		}
		r.progress, r.replaying = q.Progress()
	})
	if q.settled && !s.rep.settled.Load() {
		s.rep.settled.Store(true)
	}
	if q.settled && !q.caughtUp {
		s.rep.met.degraded.Set(1)
	} else {
		s.rep.met.degraded.Set(0)
	}
}

func (s *zmqSubscriber) batchItem(msg liveMsg) item {
	return item{rep: s.rep, kind: itemBatch, epoch: s.rep.epoch.Load(), payload: msg.payload}
}

// trySend queues a live batch without waiting.
func (s *zmqSubscriber) trySend(msg liveMsg) bool {
	select {
	case s.q <- s.batchItem(msg):
		return true
	default:
		return false
	}
}

// send queues an item, waiting for room (replayed batches and resets: the
// stream is paced by its worker, never the router).
func (s *zmqSubscriber) send(ctx context.Context, it item) bool {
	select {
	case s.q <- it:
		return true
	case <-ctx.Done():
		return false
	}
}

var (
	errReplayTimeout = errors.New("replay timed out")
	errReplayIdle    = errors.New("replay round went quiet without its end marker")
)

// replayIdle is how long a replay round that has delivered batches may go
// without a reply before its end marker counts as lost.
const replayIdle = 250 * time.Millisecond

// replay runs one replay request on a fresh DEALER: replies go to the
// sequencer, and so do live batches arriving meanwhile (it buffers them).
// It returns when the sequencer has no replay outstanding or wants another
// one, or with an error when the request could not be run or timed out.
func (s *zmqSubscriber) replay(ctx context.Context, start uint64) error {
	dealer, err := s.zctx.NewSocket(zmq.DEALER)
	if err != nil {
		return fmt.Errorf("dealer socket: %w", err)
	}
	defer func() { _ = dealer.Close() }()
	for _, set := range []error{
		dealer.SetLinger(0),
		dealer.SetRcvhwm(0),
		dealer.SetMaxmsgsize(s.cfg().MaxMessageBytes),
		dealer.SetSndtimeo(s.cfg().ReplayTimeout),
	} {
		if set != nil {
			return fmt.Errorf("dealer options: %w", set)
		}
	}
	if err := dealer.Connect(s.rep.src.ReplayEndpoint); err != nil {
		return fmt.Errorf("connect %s: %w", s.rep.src.ReplayEndpoint, err)
	}
	var req [8]byte
	binary.BigEndian.PutUint64(req[:], start)
	if _, err := dealer.SendMessage([]byte{}, req[:]); err != nil {
		return fmt.Errorf("replay request: %w", err)
	}
	s.inReplay = true
	defer func() { s.inReplay = false }()
	poller := zmq.NewPoller()
	poller.Add(dealer, zmq.POLLIN)
	poller.Add(s.sub, zmq.POLLIN)
	poller.Add(s.wake, zmq.POLLIN)
	now := s.cfg().Now()
	deadline := now.Add(s.cfg().ReplayTimeout)
	// Once the round has applied batches, a pause of replayIdle means the
	// engine finished sending and its end marker was lost (a ROUTER drops
	// replies past its send HWM): go on with the next round at once.
	idle := min(s.cfg().ReplayTimeout, replayIdle)
	lastReply := now
	// finished: this request is over (the sequencer ended or replaced it).
	finished := func() bool { return ctx.Err() != nil || !s.seq.Replaying() || s.replayWant }
	for {
		if ctx.Err() != nil {
			return nil
		}
		now := s.cfg().Now()
		if s.seq.RoundApplied() > 0 && now.Sub(lastReply) >= idle {
			return errReplayIdle
		}
		wait := min(s.cfg().PollInterval, deadline.Sub(now))
		if wait <= 0 {
			return errReplayTimeout
		}
		if s.seq.RoundApplied() > 0 {
			wait = min(wait, max(lastReply.Add(idle).Sub(now), time.Millisecond))
		}
		polled, err := poller.Poll(wait)
		if err != nil {
			if isIntr(err) {
				continue
			}
			return fmt.Errorf("poll: %w", err)
		}
		for _, p := range polled {
			if p.Socket == s.wake {
				continue // ctx ended: seen at the top of the loop
			}
			if p.Socket == s.sub {
				s.drainLive(ctx)
				if finished() {
					return nil
				}
				continue
			}
			for range drainMax {
				frames, err := dealer.RecvMessageBytes(zmq.DONTWAIT)
				if err != nil {
					if isAgain(err) {
						break
					}
					return fmt.Errorf("replay receive: %w", err)
				}
				now := s.cfg().Now()
				deadline, lastReply = now.Add(s.cfg().ReplayTimeout), now
				seq, payload, ok := parseReply(frames)
				if !ok {
					s.m.met.decodeErrors.WithLabelValues(string(s.rep.src.ID), "replay_frames").Inc()
					continue
				}
				if seq == endSeq {
					s.exec(ctx, s.seq.ReplayEnd(now))
				} else {
					s.exec(ctx, s.seq.ReplayBatch(now, liveMsg{seq, payload}))
				}
				// Time spent waiting for room in the worker queue is ours,
				// not the engine's: it does not count as a pause.
				lastReply = s.cfg().Now()
				if finished() {
					return nil
				}
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

// tick runs the timers: worker-requested resyncs, the sequencer's timers,
// and the silence flag.
func (s *zmqSubscriber) tick(ctx context.Context) {
	now := s.cfg().Now()
	if s.rep.needResync.Swap(false) {
		s.step(ctx, s.seq.DecodeError(now))
	}
	s.step(ctx, s.seq.Tick(now))
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
