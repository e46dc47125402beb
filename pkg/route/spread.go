package route

import (
	"math"
	"sync"
	"time"

	"github.com/kvroute/kvroute/pkg/index"
)

// fluidHorizon bounds a replica's fluid queue: at most this long of
// prefill at its learned speed.
const fluidHorizon = time.Minute

// workMeterWindow is the time constant of the router's work meter.
const workMeterWindow = 10 * time.Second

// workMeterLeadIn is how much time the work meter assumes before its first
// request: without it the first burst's work over the instant it arrived
// in reads as an unbounded rate.
const workMeterLeadIn = time.Second

// workMeter is the rate of prefill work the router's decisions send, in
// blocks per second, averaged with an exponential decay of
// workMeterWindow: what each request would prefill where its prompt is
// best indexed (not counting prefixes in flight), so a burst's siblings
// count their whole prompt each, as if they spread (policy.Request's
// SpreadUtil).
type workMeter struct {
	mu        sync.Mutex
	first, at time.Time
	acc       float64
	seen      bool
}

// add notes blocks of work sent at now.
func (m *workMeter) add(now time.Time, blocks float64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.decayTo(now)
	if !m.seen {
		m.first, m.seen = now, true
	}
	m.acc += blocks
}

func (m *workMeter) decayTo(now time.Time) {
	if d := now.Sub(m.at); d > 0 {
		m.acc *= math.Exp(-d.Seconds() / workMeterWindow.Seconds())
		m.at = now
	}
}

// rate is the meter's blocks per second at now (0 before any work).
func (m *workMeter) rate(now time.Time) float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.seen {
		return 0
	}
	m.decayTo(now)
	// Over a span shorter than the window the decayed sum covers only
	// that span (and the lead-in).
	w := workMeterWindow.Seconds()
	span := math.Max(now.Sub(m.first).Seconds(), 1e-3) + workMeterLeadIn.Seconds()
	return m.acc / (w * (1 - math.Exp(-span/w)))
}

// fluidQueues estimates each replica's prefill queue from the router's own
// dispatches: the uncached blocks sent there, drained at the replica's
// prefill speed (policy.Candidate.Queued), and which of them the estimate
// has not finished (Candidate.QueuedCharge).
type fluidQueues struct {
	mu sync.Mutex
	m  map[index.ReplicaID]*fluidQueue
}

type fluidQueue struct {
	q    float64
	at   time.Time
	sent []fluidSend // in order of their predicted ends
	// charged is the sum of sent's blocks. Blocks are whole numbers, so
	// the running sum is exact (below 2^53) whatever the order of its
	// additions and subtractions: get answers without walking sent, which
	// holds every unfinished dispatch (hundreds at a few hundred requests
	// a second).
	charged float64
}

// fluidSend is a dispatch: its blocks and when the estimate finishes them.
type fluidSend struct {
	blocks float64
	end    time.Time
}

// get returns the replica's queue at now, drained at rate blocks per
// second, and the blocks of its dispatches not finished by then.
func (f *fluidQueues) get(id index.ReplicaID, now time.Time, rate float64) (queued, charged float64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	e, ok := f.m[id]
	if !ok {
		return 0, 0
	}
	e.prune(now)
	return math.Max(0, e.q-now.Sub(e.at).Seconds()*rate), e.charged
}

func (e *fluidQueue) prune(now time.Time) {
	n := 0
	for n < len(e.sent) && !e.sent[n].end.After(now) {
		e.charged -= e.sent[n].blocks
		n++
	}
	e.sent = e.sent[n:]
}

// forget drops the replica's queue (it left the fleet).
func (f *fluidQueues) forget(id index.ReplicaID) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.m, id)
}

// add sends blocks (a whole number) to the replica at now, its queue
// drained at rate blocks per second since the previous add, and holding at
// most limit blocks after it (the router's limit: fluidHorizon of prefill
// at its speed).
// Without a bound a replica slower than its learned speed (a sustained
// overload, a stalled engine) would grow the estimate, and the list of
// its dispatches, for as long as that lasts. A tighter limit, the
// replica's charged prefill, changed decisions (the trace at 4 replicas,
// 0.95: p99 7.73 -> 8.94 s, 5 seeds); this one only stops the runaway.
func (f *fluidQueues) add(id index.ReplicaID, now time.Time, rate, blocks, limit float64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.m == nil {
		f.m = make(map[index.ReplicaID]*fluidQueue)
	}
	e := f.m[id]
	if e == nil {
		e = &fluidQueue{at: now}
		f.m[id] = e
	}
	e.q = math.Min(math.Max(0, e.q-now.Sub(e.at).Seconds()*rate)+blocks, math.Max(limit, blocks))
	e.at = now
	e.prune(now)
	if blocks > 0 && rate > 0 {
		e.sent = append(e.sent, fluidSend{blocks: blocks, end: now.Add(time.Duration(e.q / rate * float64(time.Second)))})
		e.charged += blocks
	}
}

// burstHorizon is the time constant over which burstSizes forgets.
const burstHorizon = 60 * time.Second

// burstSizes learns the mean size of the bursts of requests without a
// session key: a burst is a request whose prompt is not in flight anywhere
// and the requests after it that find that whole prompt in flight (its
// siblings, n samples of one prompt).
type burstSizes struct {
	mu         sync.Mutex
	at         time.Time
	lead, sibs float64
}

func (b *burstSizes) decayTo(now time.Time) {
	if d := now.Sub(b.at); d > 0 {
		k := math.Exp(-d.Seconds() / burstHorizon.Seconds())
		b.lead *= k
		b.sibs *= k
		b.at = now
	}
}

// note counts a request: a sibling or a burst's first.
func (b *burstSizes) note(now time.Time, sibling bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.decayTo(now)
	if sibling {
		b.sibs++
	} else {
		b.lead++
	}
}

// size is the mean burst size (1 before any burst).
func (b *burstSizes) size(now time.Time) float64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.decayTo(now)
	if b.lead < 1e-9 {
		return 1
	}
	return 1 + b.sibs/b.lead
}
