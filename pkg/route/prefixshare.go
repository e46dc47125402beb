package route

import (
	"math"
	"sync"
	"time"

	"github.com/kvroute/kvroute/pkg/index"
	"github.com/kvroute/kvroute/pkg/kvblock"
)

// DefaultPrefixMemory is how many prefixes' recent placements a Router
// remembers (two generations of half as many each, like session homes).
const DefaultPrefixMemory = 1 << 14

// PrefixShareHalfLife is how fast a prefix's placements are forgotten:
// each counts half after this long. A prefix draws N (the candidates)
// decayed placements only in a burst: N or more requests within about
// this time.
const PrefixShareHalfLife = time.Second

// prefixShares remembers, per prefix, how the router's recent placements
// of requests drawn by that prefix were spread over replicas, each
// placement weighed by its prompt's blocks: a replica's share is its share
// of the burst's prompt work, cached or not. Counted by requests, a
// replica that took a few of a conversation trace's 70-120k-token prompts
// had the least share of a burst over the fleet-wide system prompt, and
// the bound then sent it the burst's next requests behind 50-120k tokens
// of queue (Mooncake's conversation trace, 4 replicas, 0.8). Among
// requests of one size (a burst of one prompt length) weight and count
// agree. The prefix
// that draws a request is the longest indexed match any candidate has for
// it (its deepest matched block's key): the shared system prompt of a
// burst of new requests, the history of a session's next turn. The policy
// reads it as Candidate.PrefixShare and Request.PrefixPlacements: a prefix
// drawing many requests whose placements go mostly to one replica is
// herding there. It also keeps the largest count each prefix reached,
// read as Request.PrefixBurst: a prefix that drew a burst recently is
// expected to draw the next, whose first requests have not yet made
// their count. Safe for concurrent use (one mutex).
type prefixShares struct {
	mu       sync.Mutex
	max      int
	cur, old map[kvblock.Key]*shareEntry
}

// PrefixBurstHalfLife is how fast the largest burst a prefix drew is
// forgotten (Request.PrefixBurst): it counts half after this long. An RL
// trainer's steps, each a burst over one environment prompt, come seconds
// to minutes apart; the next step is expected to be as large as the last
// while the burst is remembered.
const PrefixBurstHalfLife = 10 * time.Minute

// shareEntry is one prefix's decayed placements: their count, their
// prompt blocks in all and by replica, and the largest count it reached
// (its peak, decayed at PrefixBurstHalfLife).
type shareEntry struct {
	at     time.Time // when the counts were last decayed
	count  float64
	peak   float64
	blocks float64
	by     map[index.ReplicaID]float64
}

// decay brings the entry's counts to now.
func (e *shareEntry) decay(now time.Time) {
	dt := now.Sub(e.at)
	d, ok := decayFactor(&e.at, now, PrefixShareHalfLife)
	if !ok {
		return
	}
	e.peak *= halved(dt, PrefixBurstHalfLife)
	e.count *= d
	e.blocks *= d
	for r, v := range e.by {
		if v *= d; v < 1e-3 {
			delete(e.by, r)
		} else {
			e.by[r] = v
		}
	}
}

func newPrefixShares(max int) *prefixShares {
	return &prefixShares{max: max, cur: map[kvblock.Key]*shareEntry{}}
}

// lookup returns the prefix's entry (nil when unknown); callers hold mu.
func (p *prefixShares) lookup(k kvblock.Key) *shareEntry {
	if e, ok := p.cur[k]; ok {
		return e
	}
	return p.old[k]
}

// get returns the prefix's placement count at now and the largest count
// it reached, each decayed to now, and calls each for every replica it
// was placed on with that replica's share of the placements' prompt
// blocks, in [0, 1].
func (p *prefixShares) get(k kvblock.Key, now time.Time, each func(index.ReplicaID, float64)) (count, peak float64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	e := p.lookup(k)
	if e == nil {
		return 0, 0
	}
	d, dp := 1.0, 1.0
	if dt := now.Sub(e.at); dt > 0 {
		d, dp = halved(dt, PrefixShareHalfLife), halved(dt, PrefixBurstHalfLife)
	}
	if e.blocks > 0 {
		for r, v := range e.by {
			each(r, v/e.blocks)
		}
	}
	return e.count * d, e.peak * dp
}

// record counts a placement at now, of a request of blocks prompt blocks
// (at least 1 counted) drawn by prefix k, on replica, the earlier ones
// decayed (PrefixShareHalfLife), and raises the prefix's peak to the
// count.
func (p *prefixShares) record(k kvblock.Key, replica index.ReplicaID, blocks int, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	e, ok := p.cur[k]
	if !ok {
		if e = p.old[k]; e != nil {
			delete(p.old, k)
		} else {
			e = &shareEntry{at: now, by: map[index.ReplicaID]float64{}}
		}
		p.cur[k] = e
		if len(p.cur) >= max(1, p.max/2) {
			p.old, p.cur = p.cur, map[kvblock.Key]*shareEntry{}
		}
	}
	e.decay(now)
	w := float64(max(1, blocks))
	e.count++
	e.peak = max(e.peak, e.count)
	e.blocks += w
	e.by[replica] += w
}

// decayFactor moves *at to now and returns the factor counts kept since
// *at shrink by with the given half-life; ok is false (and *at unchanged)
// when now is not after *at.
func decayFactor(at *time.Time, now time.Time, halfLife time.Duration) (float64, bool) {
	dt := now.Sub(*at)
	if dt <= 0 {
		return 1, false
	}
	*at = now
	return halved(dt, halfLife), true
}

// halved is the factor a count shrinks by over dt with the given
// half-life.
func halved(dt, halfLife time.Duration) float64 {
	return math.Exp2(-dt.Seconds() / halfLife.Seconds())
}
