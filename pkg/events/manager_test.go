package events

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvroute/kvroute/pkg/index"
	"github.com/kvroute/kvroute/pkg/kvblock"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

type harness struct {
	t    *testing.T
	idx  *index.Index
	reg  *prometheus.Registry
	m    *Manager
	cfg  Config
	run  chan error
	stop context.CancelFunc
}

func testConfig() Config {
	return Config{
		Workers:       2,
		PollInterval:  10 * time.Millisecond,
		ReplayTimeout: 10 * time.Second,
		BackoffMin:    20 * time.Millisecond,
		BackoffMax:    200 * time.Millisecond,
		ResyncQuiet:   time.Hour,
	}
}

func newHarness(t *testing.T, cfg Config, srcs ...Source) *harness {
	t.Helper()
	h := &harness{t: t, idx: index.New(index.Config{}), reg: prometheus.NewRegistry(), cfg: cfg, run: make(chan error, 1)}
	log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	h.m = NewManager(h.idx, cfg, h.reg, log)
	if err := h.m.SetSources(srcs); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h.stop = cancel
	go func() { h.run <- h.m.Run(ctx) }()
	t.Cleanup(h.shutdown)
	return h
}

// testWriter sends log lines to the test's log (shown on failure or -v).
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

func (h *harness) shutdown() {
	if h.stop == nil {
		return
	}
	h.stop()
	h.stop = nil
	select {
	case err := <-h.run:
		if err != nil {
			h.t.Errorf("Run: %v", err)
		}
	case <-time.After(30 * time.Second):
		h.t.Fatal("Run did not return after cancel")
	}
}

// eventually polls f until it returns nil, failing after a generous
// deadline (the machine may be loaded).
func eventually(t *testing.T, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(45 * time.Second)
	var err error
	for time.Now().Before(deadline) {
		if err = f(); err == nil {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("%s: %v", what, err)
}

func (h *harness) counter(name string, labels ...string) float64 {
	h.t.Helper()
	mfs, err := h.reg.Gather()
	if err != nil {
		h.t.Fatal(err)
	}
	total := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for i := 0; i+1 < len(labels); i += 2 {
				if have[labels[i]] != labels[i+1] {
					continue metric
				}
			}
			if c := m.GetCounter(); c != nil {
				total += c.GetValue()
			} else if g := m.GetGauge(); g != nil {
				total += g.GetValue()
			}
		}
	}
	return total
}

// synced waits until the manager has applied everything the engine
// published, the replica is caught up, and its view equals the engine's.
func (h *harness) synced(e *fakeEngine, w *workload, id index.ReplicaID) {
	h.t.Helper()
	last := e.lastSeq()
	eventually(h.t, "synced", func() error {
		st := h.m.Status(id)
		if !st.HasSeq || st.LastSeq != last {
			return fmt.Errorf("last seq %v/%d, want %d (state %s)", st.HasSeq, st.LastSeq, last, st.State)
		}
		if !st.CaughtUp || h.m.Credit(id) != 1 {
			return fmt.Errorf("not caught up: %+v", st)
		}
		return w.diff(h.idx, id)
	})
}

func source(id index.ReplicaID, e *fakeEngine) Source {
	return Source{ID: id, Model: "m", Endpoint: e.pubEP, ReplayEndpoint: e.replayEP, Topic: e.topic, BlockSize: 4}
}

// A router started after its engine learns the engine's state by the warm
// replay, then follows the live stream; both replay framings.
func TestRoundTripWarmStartAndLive(t *testing.T) {
	for _, framing := range []bool{true, false} {
		t.Run(fmt.Sprintf("topic_frame=%v", framing), func(t *testing.T) {
			e := newFakeEngine(t, engineOpts{newFraming: framing})
			w := newWorkload(t, 1, "r1", 20, 6)
			for range 60 {
				e.publish(w.next(true), false)
			}
			h := newHarness(t, testConfig(), source("r1", e))
			h.synced(e, w, "r1")
			if !h.m.Warm() {
				t.Error("Warm() false after the warm replay")
			}
			for range 120 {
				e.publish(w.next(true), false)
			}
			h.synced(e, w, "r1")
			if got := h.counter("kvroute_events_replays_total", "result", "ok"); got < 1 {
				t.Errorf("replays ok = %v", got)
			}
			if got := h.counter("kvroute_events_batches_total"); got < 180 {
				t.Errorf("batches = %v, want >= 180", got)
			}
			if got := h.counter("kvroute_events_events_total", "type", "BlockStored"); got == 0 {
				t.Error("no BlockStored counted")
			}
		})
	}
}

// Batches lost on the wire (their sequence numbers consumed) are detected
// as gaps and replayed: the final view is exact.
func TestDropsAreReplayed(t *testing.T) {
	for _, framing := range []bool{true, false} {
		t.Run(fmt.Sprintf("topic_frame=%v", framing), func(t *testing.T) {
			e := newFakeEngine(t, engineOpts{newFraming: framing})
			w := newWorkload(t, 2, "r1", 20, 6)
			h := newHarness(t, testConfig(), source("r1", e))
			eventually(t, "warm", func() error {
				if !h.m.Status("r1").Settled {
					return fmt.Errorf("not settled")
				}
				return nil
			})
			// The SUB may still be joining: publish until batches flow.
			e.publish(w.next(false), false)
			h.synced(e, w, "r1")
			for i := range 200 {
				e.publish(w.next(false), i%5 == 2)
			}
			e.publish(w.next(false), false)
			h.synced(e, w, "r1")
			if got := h.counter("kvroute_events_gaps_total"); got < 1 {
				t.Errorf("gaps = %v", got)
			}
			if got := h.counter("kvroute_events_replays_total", "result", "ok"); got < 2 {
				t.Errorf("replays ok = %v, want warm + gap replays", got)
			}
			if got := h.counter("kvroute_events_resyncs_total", "reason", "replay_failed"); got != 0 {
				t.Errorf("replay failures = %v", got)
			}
		})
	}
}

// Without replay, a gap clears the replica and withholds its credit.
func TestGapWithoutReplayResyncs(t *testing.T) {
	for _, tc := range []struct {
		name      string
		deadRelay bool
	}{{"no replay endpoint", false}, {"replay endpoint down", true}} {
		t.Run(tc.name, func(t *testing.T) {
			e := newFakeEngine(t, engineOpts{noReplay: true})
			w := newWorkload(t, 3, "r1", 4, 4)
			src := source("r1", e)
			if tc.deadRelay {
				src.ReplayEndpoint = deadEndpoint(t)
			}
			cfg := testConfig()
			cfg.ReplayTimeout = 300 * time.Millisecond
			h := newHarness(t, cfg, src)
			eventually(t, "settled", func() error {
				if !h.m.Status("r1").Settled {
					return fmt.Errorf("not settled")
				}
				return nil
			})
			// Publish prompt 0 until it is seen (the SUB may be joining).
			first := enc(t, []any{1.0, []any{w.storeEvent(0, 4)}, 0})
			w.apply(first)
			eventually(t, "first store applied", func() error {
				e.publish(first, false)
				if matchOf(h.idx, keysOf(w, 0), "r1") != 4 {
					return fmt.Errorf("prompt 0 not indexed")
				}
				return nil
			})
			lost := enc(t, []any{1.5, []any{w.storeEvent(2, 2)}, 0})
			w.apply(lost)
			e.publish(lost, true)
			after := enc(t, []any{2.0, []any{w.storeEvent(1, 4)}, 0})
			e.publish(after, false)
			eventually(t, "gap handled", func() error {
				if matchOf(h.idx, keysOf(w, 1), "r1") != 4 {
					return fmt.Errorf("batch after the gap not applied")
				}
				if matchOf(h.idx, keysOf(w, 0), "r1") != 0 {
					return fmt.Errorf("blocks from before the gap survived")
				}
				return nil
			})
			st := h.m.Status("r1")
			if !st.Resyncing || h.m.Credit("r1") != 0 {
				t.Errorf("after a gap: %+v credit %v", st, h.m.Credit("r1"))
			}
			if got := h.counter("kvroute_events_gaps_total"); got != 1 {
				t.Errorf("gaps = %v, want 1", got)
			}
			if tc.deadRelay {
				if got := h.counter("kvroute_events_replays_total", "result", "failed"); got < 1 {
					t.Errorf("failed replays = %v", got)
				}
			}
		})
	}
}

func keysOf(w *workload, p int) []kvblock.Key {
	return kvblock.Keys(nil, kvblock.Root(w.model, ""), w.prompts[p], w.bs, kvblock.Options{})
}

// deadEndpoint returns a tcp endpoint nobody listens on.
func deadEndpoint(t *testing.T) string {
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	s, _ := zctx.NewSocket(zmq.ROUTER)
	_ = s.SetLinger(0)
	if err := s.Bind("tcp://127.0.0.1:*"); err != nil {
		t.Fatal(err)
	}
	ep, _ := s.GetLastEndpoint()
	_ = s.Close()
	_ = zctx.Term()
	return ep
}

// The quiet window catches a replica up when replay is unavailable.
func TestQuietWindowCatchesUp(t *testing.T) {
	e := newFakeEngine(t, engineOpts{noReplay: true})
	w := newWorkload(t, 4, "r1", 4, 4)
	cfg := testConfig()
	cfg.ResyncQuiet = 300 * time.Millisecond
	h := newHarness(t, cfg, source("r1", e))
	e.publish(w.next(false), false) // seq 0 may be missed by a joining SUB
	eventually(t, "caught up", func() error {
		if h.m.Credit("r1") != 1 {
			return fmt.Errorf("credit 0: %+v", h.m.Status("r1"))
		}
		return nil
	})
}

// An engine restart (sequence back to 0) clears the replica and relearns it.
func TestRestartClearsAndRelearns(t *testing.T) {
	e := newFakeEngine(t, engineOpts{newFraming: true})
	w := newWorkload(t, 5, "r1", 10, 4)
	h := newHarness(t, testConfig(), source("r1", e))
	for range 30 {
		e.publish(w.next(false), false)
	}
	h.synced(e, w, "r1")
	restarts := h.counter("kvroute_events_resyncs_total", "reason", "restart")
	h.m.lookup("r1").orphanNs.Store(time.Now().UnixNano()) // as after a store below an unknown parent
	if !h.m.ViewGaps("r1") {
		t.Fatal("no view gaps after an unknown parent")
	}
	e.restart()
	w.reset()
	for range 5 {
		e.publish(w.next(false), false)
	}
	h.synced(e, w, "r1")
	if got := h.counter("kvroute_events_resyncs_total", "reason", "restart"); got != restarts+1 {
		t.Errorf("restart resyncs = %v, want %v", got, restarts+1)
	}
	if h.m.ViewGaps("r1") {
		t.Error("view gaps reported after the engine restarted (its cache is empty)")
	}
}

// AllBlocksCleared empties the replica.
func TestAllBlocksCleared(t *testing.T) {
	e := newFakeEngine(t, engineOpts{newFraming: true})
	w := newWorkload(t, 6, "r1", 6, 4)
	h := newHarness(t, testConfig(), source("r1", e))
	for range 20 {
		e.publish(w.next(false), false)
	}
	h.synced(e, w, "r1")
	if h.idx.Stats().Engine == 0 {
		t.Fatal("nothing indexed")
	}
	h.m.lookup("r1").orphanNs.Store(time.Now().UnixNano()) // as after a store below an unknown parent
	e.publish(readHex(t, "cleared_map.hex"), false)
	w.reset()
	h.synced(e, w, "r1")
	if n := h.idx.Stats().Engine; n != 0 {
		t.Errorf("%d engine hashes after AllBlocksCleared", n)
	}
	if h.m.ViewGaps("r1") {
		t.Error("view gaps reported after AllBlocksCleared (the engine's cache is empty)")
	}
}

// Listen mode: the router binds, the engine's PUB connects.
func TestListenMode(t *testing.T) {
	replay := newFakeEngine(t, engineOpts{newFraming: true}) // provides the replay ROUTER
	h := newHarness(t, testConfig(), Source{ID: "r1", Model: "m", Endpoint: "tcp://127.0.0.1:*", Listen: true,
		ReplayEndpoint: replay.replayEP, Topic: replay.topic})
	var bound string
	eventually(t, "bound", func() error {
		bound = h.m.Status("r1").Endpoint
		if bound == "" || bound == "tcp://127.0.0.1:*" {
			return fmt.Errorf("endpoint %q", bound)
		}
		return nil
	})
	e := newFakeEngine(t, engineOpts{newFraming: true, connectTo: bound})
	// Share one replay buffer: the connecting engine's batches are also
	// recorded in the replay engine, with the same sequence numbers.
	w := newWorkload(t, 7, "r1", 10, 4)
	for range 40 {
		p := w.next(false)
		replay.publish(p, true)
		e.publish(p, false)
	}
	h.synced(e, w, "r1")
}

// Removing a source closes its sockets (a listen endpoint can be bound
// again) and clears its blocks.
func TestRemoveSource(t *testing.T) {
	e := newFakeEngine(t, engineOpts{newFraming: true})
	w := newWorkload(t, 8, "r1", 6, 4)
	port := deadEndpoint(t)
	h := newHarness(t, testConfig(), source("r1", e), Source{ID: "l1", Model: "m", Endpoint: port, Listen: true})
	for range 20 {
		e.publish(w.next(false), false)
	}
	h.synced(e, w, "r1")
	eventually(t, "listener bound", func() error {
		if h.m.Status("l1").Endpoint != port {
			return fmt.Errorf("l1 endpoint %q", h.m.Status("l1").Endpoint)
		}
		return nil
	})
	if err := h.m.SetSources(nil); err != nil {
		t.Fatal(err)
	}
	if st := h.m.Status("r1"); st.Known || h.m.Credit("r1") != 0 {
		t.Errorf("removed source still known: %+v", st)
	}
	eventually(t, "blocks cleared", func() error {
		if n := h.idx.Stats().Engine; n != 0 {
			return fmt.Errorf("%d engine hashes left", n)
		}
		return nil
	})
	eventually(t, "listener closed", func() error {
		zctx, err := zmq.NewContext()
		if err != nil {
			return err
		}
		defer func() { _ = zctx.Term() }()
		s, err := zctx.NewSocket(zmq.SUB)
		if err != nil {
			return err
		}
		defer func() { _ = s.Close() }()
		_ = s.SetLinger(0)
		return s.Bind(port)
	})
	if !h.m.Warm() {
		t.Error("Warm() with no sources")
	}
}

// Malformed frames are counted and skipped; the stream goes on.
func TestBadFrames(t *testing.T) {
	e := newFakeEngine(t, engineOpts{newFraming: true})
	w := newWorkload(t, 9, "r1", 6, 4)
	h := newHarness(t, testConfig(), source("r1", e))
	e.publish(w.next(false), false)
	h.synced(e, w, "r1")
	e.sendRaw(e.topic, "short")
	e.sendRaw(e.topic, seq8(99))
	e.publish(w.next(false), false)
	h.synced(e, w, "r1")
	if got := h.counter("kvroute_events_decode_errors_total", "reason", "frames"); got != 2 {
		t.Errorf("frame errors = %v, want 2", got)
	}
}

// An undecodable batch resyncs the replica instead of silently losing it.
func TestUndecodableBatchResyncs(t *testing.T) {
	e := newFakeEngine(t, engineOpts{newFraming: true})
	w := newWorkload(t, 10, "r1", 6, 4)
	h := newHarness(t, testConfig(), source("r1", e))
	e.publish(w.next(false), false)
	h.synced(e, w, "r1")
	e.publish([]byte{0xdd, 0xff, 0xff, 0xff, 0xff}, false)
	eventually(t, "resync", func() error {
		if h.counter("kvroute_events_resyncs_total", "reason", "decode_error") != 1 {
			return fmt.Errorf("no decode_error resync")
		}
		if h.m.Credit("r1") != 0 {
			return fmt.Errorf("credit kept")
		}
		return nil
	})
	if got := h.counter("kvroute_events_decode_errors_total", "reason", "too_long"); got != 1 {
		t.Errorf("decode errors = %v", got)
	}
}

// A batch the worker cannot apply withdraws the replica's credit at once,
// without waiting for the subscriber's next wake-up: here the loops wait up
// to an hour for a message, and stopping them must not wait for that.
func TestLostBatchWithdrawsCreditAtOnce(t *testing.T) {
	e := newFakeEngine(t, engineOpts{newFraming: true})
	w := newWorkload(t, 11, "r1", 6, 4)
	cfg := testConfig()
	cfg.PollInterval = time.Hour
	h := newHarness(t, cfg, source("r1", e))
	e.publish(w.next(false), false)
	h.synced(e, w, "r1")
	e.publish([]byte{0xdd, 0xff, 0xff, 0xff, 0xff}, false)
	eventually(t, "credit withdrawn", func() error {
		if h.m.Credit("r1") != 0 || h.m.Status("r1").CaughtUp {
			return fmt.Errorf("credit kept after a lost batch")
		}
		return nil
	})
	if got := h.counter("kvroute_events_resyncs_total", "reason", "decode_error"); got != 0 {
		// The subscriber had not gone back to its hour-long wait after
		// handing over the bad batch, so it saw the worker's flag itself:
		// the credit was withdrawn either way, which is what this checks.
		t.Logf("the subscriber was still awake and resynced at once (%v)", got)
	}
	// The next message wakes the subscriber, which clears the replica.
	e.publish(w.next(false), false)
	eventually(t, "resync", func() error {
		if h.counter("kvroute_events_resyncs_total", "reason", "decode_error") != 1 {
			return fmt.Errorf("no decode_error resync")
		}
		return nil
	})
	if h.m.Credit("r1") != 0 {
		t.Error("credit restored without a replay or the quiet window")
	}
	start := time.Now()
	h.shutdown()
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("Run took %v to stop with an hour-long poll interval", d)
	}
}

func TestSetSourcesValidation(t *testing.T) {
	m := NewManager(index.New(index.Config{}), Config{}, nil, nil)
	good := Source{ID: "a", Endpoint: "tcp://127.0.0.1:1"}
	tests := []struct {
		name string
		srcs []Source
	}{
		{"no id", []Source{{Endpoint: "tcp://x:1"}}},
		{"no endpoint", []Source{{ID: "a"}}},
		{"bad engine", []Source{{ID: "a", Endpoint: "tcp://x:1", Engine: "trt"}}},
		{"duplicate", []Source{good, good}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := m.SetSources(tc.srcs); err == nil {
				t.Fatal("accepted")
			}
			if m.Status("a").Known {
				t.Fatal("a rejected set was applied")
			}
		})
	}
	if err := m.SetSources([]Source{good}); err != nil {
		t.Fatal(err)
	}
	if st := m.Status("a"); !st.Known || st.CaughtUp || m.Credit("a") != 0 || m.Warm() {
		t.Errorf("before Run: %+v", st)
	}
}

func TestRunTwice(t *testing.T) {
	h := newHarness(t, testConfig())
	eventually(t, "running", func() error {
		h.m.mu.RLock()
		defer h.m.mu.RUnlock()
		if !h.m.running {
			return fmt.Errorf("not running")
		}
		return nil
	})
	if err := h.m.Run(context.Background()); err != ErrRunning {
		t.Errorf("second Run: %v", err)
	}
}

// A warm replay that starts later than asked (the engine's buffer moved
// on) applies what it got but keeps the replica resyncing.
func TestTruncatedWarmReplay(t *testing.T) {
	e := newFakeEngine(t, engineOpts{newFraming: true, steps: 5})
	w := newWorkload(t, 11, "r1", 10, 4)
	for range 30 {
		e.publish(w.next(false), false)
	}
	h := newHarness(t, testConfig(), source("r1", e))
	eventually(t, "truncated replay", func() error {
		st := h.m.Status("r1")
		if !st.Settled || !st.HasSeq || st.LastSeq != 29 {
			return fmt.Errorf("status %+v", st)
		}
		return nil
	})
	if got := h.counter("kvroute_events_replays_total", "result", "truncated"); got < 1 {
		t.Errorf("truncated replays = %v", got)
	}
	if st := h.m.Status("r1"); !st.Resyncing || h.m.Credit("r1") != 0 || st.Reason != "replay_truncated" {
		t.Errorf("after a truncated warm replay: %+v credit %v", st, h.m.Credit("r1"))
	}
	if !h.m.Warm() {
		t.Error("a settled source holds readiness back")
	}
	rd := h.m.Readiness()
	if !rd.Warm || rd.Sources != 1 || rd.CaughtUp != 0 || len(rd.Degraded) != 1 ||
		rd.Degraded[0].ID != "r1" || rd.Degraded[0].Reason != "replay_truncated" || !rd.Degraded[0].Settled {
		t.Errorf("readiness %+v", rd)
	}
}

// A reconnect (seen by the socket monitor) clears and replays from 0.
func TestReconnectReplays(t *testing.T) {
	e := newFakeEngine(t, engineOpts{newFraming: true})
	w := newWorkload(t, 12, "r1", 10, 4)
	h := newHarness(t, testConfig(), source("r1", e))
	for range 20 {
		e.publish(w.next(false), false)
	}
	h.synced(e, w, "r1")
	e.rebind()
	eventually(t, "reconnect resync", func() error {
		if h.counter("kvroute_events_resyncs_total", "reason", "reconnect") < 1 {
			return fmt.Errorf("no reconnect resync")
		}
		return nil
	})
	for range 10 {
		e.publish(w.next(false), false)
	}
	h.synced(e, w, "r1")

	// A real restart: the sockets go away and the sequence starts over.
	e.restart()
	w.reset()
	e.rebind()
	for range 10 {
		e.publish(w.next(false), false)
	}
	h.synced(e, w, "r1")
}

// A replay with a hole (replies lost) clears the replica, applies what
// follows the hole, and keeps it resyncing.
func TestReplayWithHole(t *testing.T) {
	e := newFakeEngine(t, engineOpts{newFraming: false, holes: map[uint64]bool{5: true}})
	w := newWorkload(t, 13, "r1", 10, 4)
	for range 20 {
		e.publish(w.next(false), false)
	}
	h := newHarness(t, testConfig(), source("r1", e))
	eventually(t, "replayed", func() error {
		st := h.m.Status("r1")
		if !st.Settled || !st.HasSeq || st.LastSeq != 19 {
			return fmt.Errorf("status %+v", st)
		}
		return nil
	})
	if got := h.counter("kvroute_events_replays_total", "result", "truncated"); got != 1 {
		t.Errorf("truncated replays = %v", got)
	}
	if st := h.m.Status("r1"); !st.Resyncing || h.m.Credit("r1") != 0 || st.Reason != "replay_truncated" {
		t.Errorf("after a replay with a hole: %+v", st)
	}
}

// An engine that never connects does not hold readiness back, and its
// replica stays cold.
func TestUnreachableEngineSettles(t *testing.T) {
	cfg := testConfig()
	cfg.ReplayTimeout = 200 * time.Millisecond
	cfg.ResyncQuiet = 50 * time.Millisecond
	ep := deadEndpoint(t)
	h := newHarness(t, cfg, Source{ID: "r1", Model: "m", Endpoint: ep, ReplayEndpoint: ep})
	eventually(t, "settled", func() error {
		if !h.m.Warm() {
			return fmt.Errorf("not warm: %+v", h.m.Status("r1"))
		}
		return nil
	})
	time.Sleep(100 * time.Millisecond) // longer than the quiet window
	if st := h.m.Status("r1"); h.m.Credit("r1") != 0 || st.State != "connecting" || !st.Settled {
		t.Errorf("unreachable engine: credit %v, %+v", h.m.Credit("r1"), st)
	}
	if rd := h.m.Readiness(); !rd.Warm || len(rd.Degraded) != 1 || rd.Degraded[0].Reason != "unreachable" {
		t.Errorf("readiness %+v", rd)
	}
	if got := h.counter("kvroute_events_degraded"); got != 1 {
		t.Errorf("degraded gauge %v", got)
	}
}

// A batch naming another data-parallel rank is applied, counted and logged.
func TestDPRankMismatchCounted(t *testing.T) {
	e := newFakeEngine(t, engineOpts{newFraming: true})
	w := newWorkload(t, 14, "r1", 4, 4)
	h := newHarness(t, testConfig(), source("r1", e))
	p := enc(t, []any{ts, []any{w.storeEvent(0, 2)}, 2})
	w.apply(p)
	e.publish(p, false)
	h.synced(e, w, "r1")
	if got := h.counter("kvroute_events_decode_errors_total", "reason", "dp_rank_mismatch"); got != 1 {
		t.Errorf("dp rank mismatches = %v, want 1", got)
	}
}

// A session that cannot open (the listen port is taken) is retried with
// backoff until it can.
func TestBindFailureBacksOff(t *testing.T) {
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = zctx.Term() }()
	squat, err := zctx.NewSocket(zmq.PUB)
	if err != nil {
		t.Fatal(err)
	}
	_ = squat.SetLinger(0)
	if err := squat.Bind("tcp://127.0.0.1:*"); err != nil {
		t.Fatal(err)
	}
	ep, _ := squat.GetLastEndpoint()
	h := newHarness(t, testConfig(), Source{ID: "l1", Model: "m", Endpoint: ep, Listen: true})
	eventually(t, "backoff", func() error {
		if st := h.m.Status("l1"); st.State != "backoff" {
			return fmt.Errorf("state %q", st.State)
		}
		return nil
	})
	_ = squat.Close()
	eventually(t, "bound after the port freed", func() error {
		if st := h.m.Status("l1"); st.State != "connecting" || st.Endpoint != ep {
			return fmt.Errorf("status %+v", st)
		}
		return nil
	})
}

// Several replicas share the worker pool and one index; each one's view is
// exact and independent.
func TestManyReplicas(t *testing.T) {
	const n = 6
	var engines []*fakeEngine
	var loads []*workload
	var srcs []Source
	for i := range n {
		e := newFakeEngine(t, engineOpts{newFraming: i%2 == 0})
		id := index.ReplicaID(fmt.Sprintf("r%d", i))
		engines = append(engines, e)
		loads = append(loads, newWorkload(t, uint64(100+i), id, 8, 4))
		srcs = append(srcs, source(id, e))
	}
	h := newHarness(t, testConfig(), srcs...)
	for round := range 15 {
		for i, e := range engines {
			e.publish(loads[i].next(true), round%4 == 1)
		}
	}
	for i, e := range engines {
		e.publish(loads[i].next(false), false)
	}
	for i, e := range engines {
		id := srcs[i].ID
		last := e.lastSeq()
		w := loads[i]
		eventually(t, string(id), func() error {
			st := h.m.Status(id)
			if !st.HasSeq || st.LastSeq != last || !st.CaughtUp {
				return fmt.Errorf("status %+v, want last %d", st, last)
			}
			// Compare per-prompt matches only: the index is shared.
			root := kvblock.Root(w.model, "")
			for p, toks := range w.prompts {
				keys := kvblock.Keys(nil, root, toks, w.bs, kvblock.Options{})
				if got, want := matchOf(h.idx, keys, id), matchOf(w.oracle, keys, id); got != want {
					return fmt.Errorf("prompt %d: %d blocks, engine holds %d", p, got, want)
				}
			}
			return nil
		})
	}
}
