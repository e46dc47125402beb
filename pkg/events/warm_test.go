package events

import (
	"fmt"
	"sync"
	"testing"
	"time"
)

// A router restarted on a fleet whose engines hold a full replay buffer
// (10,000 batches, vLLM's buffer_steps) relearns it completely by replay,
// while the engine keeps publishing, although the engine's ROUTER drops
// replies past its send HWM as vLLM's does. The replica is caught up by the
// replay (the quiet window is an hour), and its view equals the engine's.
func TestWarmRestartFullReplayBuffer(t *testing.T) {
	if testing.Short() {
		t.Skip("publishes 10,000 batches")
	}
	const steps = 10000
	// The engine holds 10,000 batches from seq 0 (its buffer is full at
	// vLLM's default buffer_steps); room for what it publishes while the
	// router warms up, so seq 0 is still there when the replay is served.
	// (Once an engine's buffer has wrapped, the blocks stored by evicted
	// batches are unknowable: such a replay ends truncated, see
	// TestTruncatedWarmReplay.)
	e := newFakeEngine(t, engineOpts{newFraming: true, steps: steps + 5000, vllmHWM: true})
	w := newWorkload(t, 21, "r1", 400, 16)
	t0 := time.Now()
	batch := make([][]byte, steps)
	for i := range batch {
		batch[i] = w.next(false)
	}
	e.publishAll(batch)
	t.Logf("engine buffer filled in %v", time.Since(t0).Round(time.Millisecond))
	start := time.Now()
	h := newHarness(t, testConfig(), source("r1", e))
	// The engine keeps serving traffic while the router warms up.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var once sync.Once
	halt := func() { once.Do(func() { close(stop) }); wg.Wait() }
	t.Cleanup(halt) // before the engine closes
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
				e.publish(w.next(false), false)
			}
		}
	}()
	eventually(t, "caught up by replay", func() error {
		if st := h.m.Status("r1"); !st.CaughtUp {
			return fmt.Errorf("not caught up: %+v", st)
		}
		return nil
	})
	affinity := time.Since(start)
	halt()
	t1 := time.Now()
	h.synced(e, w, "r1")
	t.Logf("compared with the engine in %v", time.Since(t1).Round(time.Millisecond))
	if got := h.counter("kvroute_events_replays_total", "result", "partial"); got == 0 {
		t.Log("no replay round lost replies (the engine's ROUTER kept up)")
	} else {
		t.Logf("%v replay rounds lost replies and were asked again", got)
	}
	t.Logf("time to cache affinity after a restart against a full %d-batch replay buffer: %v", steps, affinity.Round(time.Millisecond))
	if got := h.counter("kvroute_events_resyncs_total", "reason", "replay_truncated"); got != 0 {
		t.Errorf("replay truncated %v times", got)
	}
	rd := h.m.Readiness()
	if !rd.Warm || rd.Sources != 1 || rd.CaughtUp != 1 || len(rd.Degraded) != 0 {
		t.Errorf("readiness %+v", rd)
	}
	if got := h.counter("kvroute_events_replayed_batches_total"); got < steps {
		t.Errorf("replayed %v batches, want at least %d", got, steps)
	}
	if got := h.counter("kvroute_events_degraded"); got != 0 {
		t.Errorf("degraded gauge %v", got)
	}
}
