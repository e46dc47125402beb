package load

import (
	"math"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// InFlight is the router's own view of one replica: what it routed there and
// has not yet seen finish.
type InFlight struct {
	// PrefillBlocks are uncached prompt blocks of requests without a first
	// token yet.
	PrefillBlocks int
	// DecodeBlocks are the KV blocks of requests in flight (prefilling or
	// decoding): the footprint they hold on the engine.
	DecodeBlocks int
	// Requests are requests in flight.
	Requests int
	// OldestWait is how long the replica's oldest streamed request still
	// without a first token has waited (Output.Streams; 0: none waits),
	// and OldestBlocks the prefill blocks that were ahead of it when it
	// started plus its own. Every request started before it has had its
	// first token, so in OldestWait the replica has prefilled about
	// OldestBlocks blocks at most (the blocks are what Start was given,
	// not what the engine computed): a bound on its prefill speed known
	// before any first token of it comes back.
	OldestWait   time.Duration
	OldestBlocks int
}

// Tracker counts in-flight work per replica from the request lifecycle.
//
// Readers (Get, Snapshot) touch only per-replica atomics, and so do writers
// (Start, Handle.FirstToken, Handle.Done) but for the ledger and the
// waiting list below: a reader never waits for a writer. Each figure is
// individually exact; a reader racing a writer may see one figure updated
// before another.
//
// The tracker also keeps the mean size of the requests it starts, per
// replica (MeanRequest): View uses it to put a size on requests other
// routers sent, which it sees only as counts.
//
// A request started with an expected output (StartExpecting) joins its
// replica's decoding ledger at its first token and leaves it when done:
// Releases lists them, for the router to predict when the engine will
// free their KV blocks. A request whose response streams (Output.Streams)
// is in its replica's waiting list from its start to its first token (or
// its end): the oldest of them, with the prefill blocks that were ahead of
// it, is InFlight.OldestWait and OldestBlocks. The ledger and the waiting
// list are the parts behind a lock (one per replica, held for a map or
// list insert or delete, or for the copy Releases makes); readers of the
// oldest read two atomics the writers set under it, and requests that
// neither expect an output nor stream never take it.
type Tracker struct {
	replicas sync.Map // string -> *inflight
	starts   atomic.Int64
	now      func() time.Time
}

type inflight struct {
	prefill, decode, requests atomic.Int64
	meanPrefill, meanDecode   ewma
	now                       func() time.Time // the tracker's clock (SetClock)
	// The head of waiting, copied for readers: its start (Unix
	// nanoseconds on the tracker's clock; 0: none waits) and blocks
	// (ahead of it plus its own).
	oldestSince, oldestBlocks atomic.Int64

	mu       sync.Mutex           // guards decoding, waiting and their handles' state changes
	decoding map[*Handle]struct{} // started with an expected output and past their first token
	// waiting are the streamed handles without a first token, oldest
	// first (a list through Handle.prev and Handle.next).
	waiting struct{ head, tail *Handle }
}

// Output is what a request is expected to generate: its output tokens (the
// router's estimate from the request's max_tokens) and the KV blocks they
// take, and whether its
// response streams them (its first token is seen when it is generated,
// not with the whole answer; such requests bound their replica's prefill
// speed while they wait, InFlight.OldestWait). A request with no tokens
// expected stays out of the decoding ledger, streamed or not.
type Output struct {
	Tokens  int
	Blocks  float64
	Streams bool
}

// Release is one decoding request on a replica, as the tracker's ledger
// has it: the KV blocks it holds by its end (prompt and expected output)
// and how far it has got. A request generating one token per decode step
// s ends Output.Tokens*s - Decoding from now.
type Release struct {
	Blocks   float64
	Output   int
	Decoding time.Duration
}

// RequestSize is a mean request's size in blocks.
type RequestSize struct {
	// PrefillBlocks are its uncached prompt blocks (what Start was given as
	// prefillBlocks).
	PrefillBlocks float64
	// DecodeBlocks are the KV blocks it holds while in flight (Start's
	// decodeBlocks).
	DecodeBlocks float64
}

// meanWeight is the weight of one request in the tracker's mean request
// size: the mean follows roughly the last 32 requests.
const meanWeight = 1.0 / 32

// ewma is a lock-free exponentially weighted mean of non-negative values.
// Its zero value holds no sample: a mean of exactly 0 is stored as -0.0,
// whose bits are not zero.
type ewma struct{ bits atomic.Uint64 }

func (e *ewma) observe(x float64) {
	for {
		old := e.bits.Load()
		next := x
		if old != 0 {
			m := math.Float64frombits(old)
			next = m + meanWeight*(x-m)
		}
		if next == 0 {
			next = math.Copysign(0, -1)
		}
		if e.bits.CompareAndSwap(old, math.Float64bits(next)) {
			return
		}
	}
}

// mean returns the mean (never -0.0) and whether there was any sample.
func (e *ewma) mean() (float64, bool) {
	b := e.bits.Load()
	if b == 0 {
		return 0, false
	}
	return math.Abs(math.Float64frombits(b)), true
}

// NewTracker returns an empty tracker and registers its gauges
// (kvroute_replica_inflight_requests, kvroute_replica_active_prefill_blocks,
// kvroute_replica_active_decode_blocks) with reg, unless reg is nil.
func NewTracker(reg prometheus.Registerer) (*Tracker, error) {
	t := &Tracker{now: time.Now}
	if reg != nil {
		if err := reg.Register(newTrackerCollector(t)); err != nil {
			return nil, err
		}
	}
	return t, nil
}

func (t *Tracker) counters(replica string) *inflight {
	if c, ok := t.replicas.Load(replica); ok {
		return c.(*inflight)
	}
	c, _ := t.replicas.LoadOrStore(replica, &inflight{now: t.now})
	return c.(*inflight)
}

// expecting reports whether h was started with an expected output
// (StartExpecting): it joins its replica's decoding ledger.
func (h *Handle) expecting() bool { return h.out.Tokens > 0 }

// SetClock makes the tracker read time from now (a simulator's clock)
// instead of time.Now. Call it before the tracker is used: each replica's
// counters take the clock when the replica is first seen.
func (t *Tracker) SetClock(now func() time.Time) { t.now = now }

// Start records a request routed to replica: prefillBlocks (its uncached
// prompt blocks) join the replica's active prefill, decodeBlocks (the KV
// blocks it will hold) its active decode footprint, and the request count
// rises by one. Negative block counts are taken as 0. The returned handle
// must be finished with Done on every path; Done on a nil handle is a no-op.
func (t *Tracker) Start(replica string, prefillBlocks, decodeBlocks int) *Handle {
	return t.StartExpecting(replica, prefillBlocks, decodeBlocks, Output{})
}

// StartExpecting is Start for a request expected to generate out: from its
// first token until Done it is in the replica's decoding ledger
// (Releases). An out of no tokens keeps it out of the ledger, as Start.
func (t *Tracker) StartExpecting(replica string, prefillBlocks, decodeBlocks int, out Output) *Handle {
	c := t.counters(replica)
	h := &Handle{c: c, prefill: int64(max(prefillBlocks, 0)), decode: int64(max(decodeBlocks, 0))}
	if out.Tokens > 0 && out.Blocks >= 0 {
		h.out = Output{Tokens: out.Tokens, Blocks: out.Blocks}
	}
	if out.Streams {
		h.timed = true
		c.mu.Lock()
		h.since = c.now()
		h.ahead = c.prefill.Load()
		c.push(h)
		c.mu.Unlock()
	}
	c.prefill.Add(h.prefill)
	c.decode.Add(h.decode)
	c.requests.Add(1)
	t.starts.Add(1)
	c.meanPrefill.observe(float64(h.prefill))
	c.meanDecode.observe(float64(h.decode))
	return h
}

// Starts is the number of requests started so far, over all replicas (a
// scraper compares it between scrapes to tell a routing router from an
// idle one).
func (t *Tracker) Starts() int64 { return t.starts.Load() }

// MeanRequest returns the mean size of the requests started on replica
// (an exponentially weighted mean over roughly the last 32), or, when none
// was, the average of the other replicas' means; ok is false when the
// tracker has started nothing at all. The two figures are read
// independently.
func (t *Tracker) MeanRequest(replica string) (size RequestSize, ok bool) {
	if v, found := t.replicas.Load(replica); found {
		if size, ok := v.(*inflight).meanRequest(); ok {
			return size, true
		}
	}
	var sum RequestSize
	n := 0
	t.replicas.Range(func(_, v any) bool {
		if s, ok := v.(*inflight).meanRequest(); ok {
			sum.PrefillBlocks += s.PrefillBlocks
			sum.DecodeBlocks += s.DecodeBlocks
			n++
		}
		return true
	})
	if n == 0 {
		return RequestSize{}, false
	}
	return RequestSize{PrefillBlocks: sum.PrefillBlocks / float64(n), DecodeBlocks: sum.DecodeBlocks / float64(n)}, true
}

func (c *inflight) meanRequest() (RequestSize, bool) {
	p, okP := c.meanPrefill.mean()
	d, okD := c.meanDecode.mean()
	return RequestSize{PrefillBlocks: p, DecodeBlocks: d}, okP && okD
}

// Releases appends to dst the replica's decoding ledger: every request
// started with an expected output (StartExpecting) that has had its first
// token and is not done, in no particular order.
func (t *Tracker) Releases(replica string, dst []Release) []Release {
	v, ok := t.replicas.Load(replica)
	if !ok {
		return dst
	}
	c := v.(*inflight)
	now := c.now()
	c.mu.Lock()
	for h := range c.decoding {
		dst = append(dst, Release{Blocks: float64(h.decode) + h.out.Blocks, Output: h.out.Tokens, Decoding: now.Sub(h.first)})
	}
	c.mu.Unlock()
	return dst
}

// Get returns replica's in-flight figures (zero for an unknown replica).
func (t *Tracker) Get(replica string) InFlight {
	v, ok := t.replicas.Load(replica)
	if !ok {
		return InFlight{}
	}
	c := v.(*inflight)
	f := InFlight{
		PrefillBlocks: int(c.prefill.Load()),
		DecodeBlocks:  int(c.decode.Load()),
		Requests:      int(c.requests.Load()),
	}
	if since := c.oldestSince.Load(); since != 0 {
		f.OldestWait = max(c.now().Sub(time.Unix(0, since)), 0)
		f.OldestBlocks = int(c.oldestBlocks.Load())
	}
	return f
}

// push appends h to c's waiting list (c.mu held).
func (c *inflight) push(h *Handle) {
	h.prev, h.next = c.waiting.tail, nil
	if c.waiting.tail != nil {
		c.waiting.tail.next = h
	} else {
		c.waiting.head = h
		c.setOldest()
	}
	c.waiting.tail = h
}

// unlink takes h out of c's waiting list if it is in it (c.mu held).
func (c *inflight) unlink(h *Handle) {
	if !h.timed || (h.prev == nil && c.waiting.head != h) {
		return // never listed, or already out
	}
	head := h.prev == nil
	if h.prev != nil {
		h.prev.next = h.next
	} else {
		c.waiting.head = h.next
	}
	if h.next != nil {
		h.next.prev = h.prev
	} else {
		c.waiting.tail = h.prev
	}
	h.prev, h.next = nil, nil
	if head {
		c.setOldest()
	}
}

// setOldest copies the waiting list's head for readers (c.mu held).
func (c *inflight) setOldest() {
	h := c.waiting.head
	if h == nil {
		c.oldestSince.Store(0)
		return
	}
	c.oldestBlocks.Store(h.ahead + h.prefill)
	c.oldestSince.Store(max(h.since.UnixNano(), 1))
}

// Snapshot returns every replica the tracker has seen, by name.
func (t *Tracker) Snapshot() map[string]InFlight {
	out := make(map[string]InFlight)
	t.replicas.Range(func(k, _ any) bool {
		out[k.(string)] = t.Get(k.(string))
		return true
	})
	return out
}

// Handle is one request's hold on a replica's counters. Its methods are
// idempotent and safe for concurrent use: FirstToken releases the prefill
// share once; Done releases whatever is still held, once.
type Handle struct {
	c               *inflight
	prefill, decode int64
	state           atomic.Uint32 // handleStarted -> handleDecoding -> handleDone

	// An expecting handle (StartExpecting, out.Tokens > 0): its output and
	// its first token's time; its state changes under c.mu.
	out   Output
	first time.Time
	// A timed handle (Output.Streams) is in c.waiting until its first
	// token, under c.mu: its start, the prefill blocks ahead of it then,
	// and its neighbours in the list.
	timed      bool
	since      time.Time
	ahead      int64
	prev, next *Handle
}

const (
	handleStarted uint32 = iota
	handleDecoding
	handleDone
)

// FirstToken marks the end of prefill: the request's prefill blocks leave
// the replica's active prefill; its decode footprint stays until Done.
func (h *Handle) FirstToken() {
	if h == nil {
		return
	}
	if h.expecting() || h.timed {
		h.c.mu.Lock()
		defer h.c.mu.Unlock()
	}
	if h.state.CompareAndSwap(handleStarted, handleDecoding) {
		h.c.unlink(h)
		h.c.prefill.Add(-h.prefill)
		if h.expecting() {
			h.first = h.c.now()
			if h.c.decoding == nil {
				h.c.decoding = make(map[*Handle]struct{})
			}
			h.c.decoding[h] = struct{}{}
		}
	}
}

// Done releases the request: every counter it raised falls back.
func (h *Handle) Done() {
	if h == nil {
		return
	}
	if h.expecting() || h.timed {
		h.c.mu.Lock()
		defer h.c.mu.Unlock()
		delete(h.c.decoding, h)
		h.c.unlink(h)
	}
	for {
		s := h.state.Load()
		if s == handleDone {
			return
		}
		if h.state.CompareAndSwap(s, handleDone) {
			if s == handleStarted {
				h.c.prefill.Add(-h.prefill)
			}
			h.c.decode.Add(-h.decode)
			h.c.requests.Add(-1)
			return
		}
	}
}

type trackerCollector struct {
	t                         *Tracker
	requests, prefill, decode *prometheus.Desc
}

func newTrackerCollector(t *Tracker) *trackerCollector {
	l := []string{"replica"}
	return &trackerCollector{
		t:        t,
		requests: prometheus.NewDesc("kvroute_replica_inflight_requests", "Requests this router routed to the replica that have not finished.", l, nil),
		prefill:  prometheus.NewDesc("kvroute_replica_active_prefill_blocks", "Uncached prompt blocks of in-flight requests still prefilling.", l, nil),
		decode:   prometheus.NewDesc("kvroute_replica_active_decode_blocks", "KV blocks held by in-flight requests.", l, nil),
	}
}

func (c *trackerCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.requests
	ch <- c.prefill
	ch <- c.decode
}

func (c *trackerCollector) Collect(ch chan<- prometheus.Metric) {
	snap := c.t.Snapshot()
	for _, r := range sortedKeys(snap) {
		f := snap[r]
		ch <- prometheus.MustNewConstMetric(c.requests, prometheus.GaugeValue, float64(f.Requests), r)
		ch <- prometheus.MustNewConstMetric(c.prefill, prometheus.GaugeValue, float64(f.PrefillBlocks), r)
		ch <- prometheus.MustNewConstMetric(c.decode, prometheus.GaugeValue, float64(f.DecodeBlocks), r)
	}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
