package tokenize

import (
	"math/bits"
	"slices"
	"sync"
	"time"

	"github.com/zeebo/xxh3"
)

// Remote deadline defaults (ModelConfig.Timeout unset: the deadline adapts).
const (
	// DefaultTimeoutMin and DefaultTimeoutMax bound the adaptive deadline
	// (the maximum is half of extproc's default 2s decision budget, so a
	// timed-out call still leaves time to route on approximate tokens).
	// The minimum is generous: a loaded host stalls a fast call now and
	// then, and a hung engine costs it only until its breaker opens.
	DefaultTimeoutMin = 250 * time.Millisecond
	DefaultTimeoutMax = time.Second
	// DeadlineMultiplier times the recent 95th percentile latency of
	// inputs of the same size class is the adaptive deadline.
	DeadlineMultiplier = 4
	// deadlineWindow is how many recent calls each size class remembers;
	// deadlineMinSamples how many it needs before it trusts them (until
	// then the deadline is the maximum: learn before cutting anyone off).
	deadlineWindow     = 64
	deadlineMinSamples = 8
	// sizeClasses: inputs up to 16 KiB, 64 KiB, 256 KiB, 1 MiB, 4 MiB and
	// larger are timed apart (a /tokenize call's latency grows with its
	// input).
	sizeClasses = 6
)

// deadlines derives a remote tokenizer's per-call deadline from the
// latencies it measured: DeadlineMultiplier × the 95th percentile of the
// last deadlineWindow calls of the input's size class, clamped to
// [min, max]. A call that timed out counts as taking its deadline, so a
// sustained slowdown raises the deadline (a lone slow call does not move
// the percentile). A fixed timeout (ModelConfig.Timeout) bypasses it. Safe
// for concurrent use.
type deadlines struct {
	fixed, min, max time.Duration

	mu      sync.Mutex
	classes [sizeClasses]latencyWindow
}

type latencyWindow struct {
	obs  [deadlineWindow]time.Duration
	n    int // observations so far (the ring holds the last deadlineWindow)
	next int
	cur  time.Duration // the deadline, recomputed on every observation
}

func newDeadlines(mc ModelConfig) *deadlines {
	return &deadlines{fixed: mc.Timeout, min: mc.TimeoutMin, max: mc.TimeoutMax}
}

// sizeClass maps an input size to its latency window.
func sizeClass(n int) int {
	c := (bits.Len(uint(n>>14)) + 1) / 2 // 0: < 16 KiB, 1: < 64 KiB, ...
	return min(c, sizeClasses-1)
}

// deadline is the time one call with an input of n bytes may take.
func (d *deadlines) deadline(n int) time.Duration {
	if d.fixed > 0 {
		return d.fixed
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	w := &d.classes[sizeClass(n)]
	if w.n < deadlineMinSamples {
		return d.max
	}
	return w.cur
}

// observe records a call's latency (its deadline when it timed out).
func (d *deadlines) observe(n int, took time.Duration) {
	if d.fixed > 0 {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	w := &d.classes[sizeClass(n)]
	w.obs[w.next] = took
	w.next = (w.next + 1) % deadlineWindow
	w.n++
	var buf [deadlineWindow]time.Duration
	s := buf[:copy(buf[:], w.obs[:min(w.n, deadlineWindow)])]
	slices.Sort(s)
	p95 := s[(len(s)*95-1)/100]
	w.cur = min(max(DeadlineMultiplier*p95, d.min), d.max)
}

// learned reports the current deadline of the smallest inputs and how many
// calls taught it (explain).
func (d *deadlines) learned() (time.Duration, int) {
	if d.fixed > 0 {
		return d.fixed, 0
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	w := &d.classes[0]
	if w.n < deadlineMinSamples {
		return d.max, w.n
	}
	return w.cur, w.n
}

// flights coalesces identical in-flight remote tokenizations: the first
// caller of a key (the leader) makes the call, later callers of the same
// key wait for its answer instead of calling again.
type flights struct {
	mu sync.Mutex
	m  map[xxh3.Uint128]*flight
}

type flight struct {
	done    chan struct{}
	ids     []uint32
	err     error
	waiters int // joined so far (under flights.mu)
}

// join returns key's flight and whether the caller leads it (and must
// call land when done).
func (f *flights) join(key xxh3.Uint128) (*flight, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if fl, ok := f.m[key]; ok {
		fl.waiters++
		return fl, false
	}
	if f.m == nil {
		f.m = map[xxh3.Uint128]*flight{}
	}
	fl := &flight{done: make(chan struct{})}
	f.m[key] = fl
	return fl, true
}

// abandon retires fl if nobody waits for it (its leader's request ended):
// it reports whether it did, i.e. whether the call may be cancelled.
func (f *flights) abandon(key xxh3.Uint128, fl *flight) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if fl.waiters > 0 {
		return false
	}
	if f.m[key] == fl {
		delete(f.m, key)
	}
	return true
}

// land publishes the leader's answer to the waiters and retires the key.
func (f *flights) land(key xxh3.Uint128, fl *flight, ids []uint32, err error) {
	f.mu.Lock()
	if f.m[key] == fl {
		delete(f.m, key)
	}
	f.mu.Unlock()
	fl.ids, fl.err = ids, err
	close(fl.done)
}
