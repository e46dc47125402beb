package route

import (
	"container/heap"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/kvroute/kvroute/pkg/index"
	"github.com/kvroute/kvroute/pkg/kvblock"
	"github.com/kvroute/kvroute/pkg/policy"
)

// DefaultSessionHorizon is Options.SessionHorizon's default: a session
// counts as living on its home replica for this many of its inter-turn
// gaps after its latest request.
const DefaultSessionHorizon = 3.0

// SessionStatsHalfLife is how fast the router forgets what sessions
// starting on a prefix went on to do (their later turns, work per turn,
// gaps): each observation counts half after this long.
const SessionStatsHalfLife = 5 * time.Minute

// MinSessionGap: a request of a session sent sooner than this after its
// previous one is a parallel request (n samples, fan-out siblings sharing
// a key), not a later turn: it is not counted as a turn nor as a gap.
const MinSessionGap = 100 * time.Millisecond

// sessionBook is the router's memory of the sessions living on each
// replica and of what a new session is likely to bring (see
// policy.Candidate.Sessions and policy.Request.Future).
//
// A session (a request's session key) lives on its home replica from each
// of its requests until horizon times its inter-turn gap has passed
// without another. While it lives it commits the replica to its future
// turns: a turn every gap seconds, each bringing its uncached prefill
// (the mean of its later turns' uncached blocks). A replica's committed
// load is the sum over its living sessions of their turn rate, blocks per
// second and squared blocks per second: the queue the instantaneous load
// does not see while the sessions think or wait on tools.
//
// What a session does after its first request is learned per start class:
// the prefix that drew its first request (the longest indexed match, as
// for prefixShares) and, as the fallback a class with few starts is
// shrunk to, the kind of its key (header, OpenAI user, conversation
// opening). Per class, with SessionStatsHalfLife decay: sessions started,
// sessions that came back, later turns, their uncached blocks (sum and
// sum of squares) and inter-turn gaps. A session known only by its first
// request commits the class's mean gap and blocks, weighted by the
// class's share of sessions that came back.
//
// Bounded like the homes: two generations of max/2 sessions, and the
// classes like the prefix shares. Safe for concurrent use (one mutex).
type sessionBook struct {
	mu      sync.Mutex
	max     int
	horizon float64
	cur     map[string]*bookSession
	old     map[string]*bookSession
	reps    map[index.ReplicaID]*policy.SessionLoad
	exp     expiries
	classes map[kvblock.Key]*classStats
	oldCls  map[kvblock.Key]*classStats
	kinds   [numKinds]classStats
}

// Key kinds: how a session's key was derived (SessionKey). A client's
// name for one conversation (the header, the body's session id: "sid:")
// is kindHeader; a key that may span conversations (the user field,
// "user:", and prompt_cache_key, "pck:") is kindUser; a conversation's
// opening ("conv:") is kindConv.
const (
	kindHeader = iota
	kindUser
	kindConv
	numKinds
)

// keyKind is the kind of a session key.
func keyKind(key string) int {
	switch {
	case strings.HasPrefix(key, "conv:"):
		return kindConv
	case strings.HasPrefix(key, "user:"), strings.HasPrefix(key, "pck:"):
		return kindUser
	}
	return kindHeader
}

// bookSession is one session's record.
type bookSession struct {
	key         string
	class       kvblock.Key
	classed     bool // class is a drawing prefix (else the kind only)
	kind        int
	home        index.ReplicaID
	first, last time.Time
	turns       int     // requests counted as turns, the first included
	burst       int     // requests in its current parallel burst (its latest turn and the siblings within MinSessionGap of it)
	spread      bool    // its policy spread the burst's second request (policy.Result.Spread)
	sumW, sumW2 float64 // uncached blocks of the later turns
	load        policy.SessionLoad
	live        bool // load is counted in reps[home]
	expiry      time.Time
	gen         uint64 // bumps on every update; stale expiries are skipped
}

// classStats are decayed counts of what sessions of one start class did.
type classStats struct {
	at                 time.Time
	starts, back       float64 // sessions started; of them, sessions with a later turn
	ended, ended1      float64 // sessions whose horizon passed; of them, after one request
	turns, sumW, sumW2 float64 // later turns and their uncached blocks
	gaps, gapN         float64 // inter-turn gaps (seconds) and their count
	bursts, par        float64 // requests that began a burst; parallel requests (within MinSessionGap of their burst's first)
	// on counts, per replica, the sessions started there (a key kind's
	// only; nil for a start class): where its round of sessions of
	// unknown future went (see sessionBook.round).
	on map[index.ReplicaID]float64
}

func (c *classStats) decay(now time.Time) {
	if c.at.IsZero() {
		c.at = now
		return
	}
	d, ok := decayFactor(&c.at, now, SessionStatsHalfLife)
	if !ok {
		return
	}
	c.starts *= d
	c.back *= d
	c.ended *= d
	c.ended1 *= d
	c.turns *= d
	c.sumW *= d
	c.sumW2 *= d
	c.gaps *= d
	c.gapN *= d
	c.bursts *= d
	c.par *= d
	for id, v := range c.on {
		if v *= d; v < 1e-3 {
			delete(c.on, id)
		} else {
			c.on[id] = v
		}
	}
}

// estimate is a class's prediction for a new session: later turns, mean
// gap (seconds, 0 unknown), uncached blocks per turn and their mean
// square, and the share of sessions that come back.
//
// The share coming back is sessions with a later turn over sessions
// started: what the class showed so far (a young class's share is low by
// the sessions started within the last gap), so a class of one-shot
// requests predicts nothing it cannot yet know has ended. Later turns are
// that share times the later turns of a session that came back: each of
// its requests is followed by another with some chance p, and it ends
// when its horizon passes after a request, so p/(1-p) is estimated by the
// later turns over the ended sessions that had come back, which counts a
// session still running neither as ended nor by the turns it has yet to
// send (one pseudo-end keeps it finite while every such session still
// runs). A trace whose conversations return once in twenty, ~90 s later,
// so predicts about a twentieth of what its few returning conversations
// showed, not what they showed. A class is shrunk toward prior (its
// kind's estimate) with the weight of one session.
type estimate struct {
	turns, gap, w, w2, back float64
}

func (c *classStats) estimate(prior *estimate) estimate {
	var e estimate
	k := 0.0
	if prior != nil {
		k = 1
		e = *prior
	}
	if n := c.starts + k; n > 0 {
		e.back = math.Min(1, (c.back+k*e.back)/n)
	}
	r := 0.0
	if prior != nil && prior.back > 0 {
		r = prior.turns / prior.back
	}
	e.turns = e.back * (c.turns + k*r) / (c.ended - c.ended1 + 1)
	if n := c.turns + k; n > 0 && (c.turns > 0 || e.w > 0) {
		e.w = (c.sumW + k*e.w) / n
		e.w2 = (c.sumW2 + k*e.w2) / n
	}
	if n := c.gapN + k; n > 0 && (c.gapN > 0 || e.gap > 0) {
		e.gap = (c.gaps + k*e.gap) / n
	}
	return e
}

// expiries is a min-heap of session expiries.
type expiry struct {
	at  time.Time
	s   *bookSession
	gen uint64
}

type expiries []expiry

func (h expiries) Len() int           { return len(h) }
func (h expiries) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h expiries) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *expiries) Push(x any)        { *h = append(*h, x.(expiry)) }
func (h *expiries) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

func newSessionBook(max int, horizon float64) *sessionBook {
	if max <= 0 {
		return nil
	}
	if !(horizon > 0) || math.IsInf(horizon, 0) {
		horizon = DefaultSessionHorizon
	}
	return &sessionBook{
		max: max, horizon: horizon,
		cur:     map[string]*bookSession{},
		reps:    map[index.ReplicaID]*policy.SessionLoad{},
		classes: map[kvblock.Key]*classStats{},
	}
}

func (b *sessionBook) lookup(key string) *bookSession {
	if s, ok := b.cur[key]; ok {
		return s
	}
	return b.old[key]
}

// expire drops the load of sessions whose horizon passed before now;
// callers hold mu.
func (b *sessionBook) expire(now time.Time) {
	for len(b.exp) > 0 && !b.exp[0].at.After(now) {
		e := heap.Pop(&b.exp).(expiry)
		if e.gen == e.s.gen && e.s.live {
			b.unload(e.s)
			for _, c := range b.statsOf(e.s, e.at) {
				c.ended++
				if e.s.turns == 1 {
					c.ended1++
				}
			}
		}
	}
}

// forget drops what the book holds for a replica that left the fleet: the
// load its living sessions committed there (they no longer count
// anywhere; their next request finds no home and starts afresh).
func (b *sessionBook) forget(replica index.ReplicaID) {
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, m := range []map[string]*bookSession{b.cur, b.old} {
		for _, s := range m {
			if s.home == replica {
				s.live = false
			}
		}
	}
	delete(b.reps, replica)
	for i := range b.kinds {
		delete(b.kinds[i].on, replica)
	}
}

// unload removes the session's committed load from its home.
func (b *sessionBook) unload(s *bookSession) {
	if !s.live {
		return
	}
	s.live = false
	r := b.reps[s.home]
	if r == nil {
		return
	}
	r.Sessions--
	if r.Sessions <= 0 {
		delete(b.reps, s.home)
		return
	}
	r.Rate = math.Max(0, r.Rate-s.load.Rate)
	r.Blocks = math.Max(0, r.Blocks-s.load.Blocks)
	r.BlocksSq = math.Max(0, r.BlocksSq-s.load.BlocksSq)
}

// class returns the start class's stats (nil without a drawing prefix).
func (b *sessionBook) class(k kvblock.Key, ok bool, create bool) *classStats {
	if !ok {
		return nil
	}
	if c, found := b.classes[k]; found {
		return c
	}
	if c, found := b.oldCls[k]; found {
		delete(b.oldCls, k)
		b.putClass(k, c)
		return c
	}
	if !create {
		return nil
	}
	c := &classStats{}
	b.putClass(k, c)
	return c
}

func (b *sessionBook) putClass(k kvblock.Key, c *classStats) {
	b.classes[k] = c
	if len(b.classes) >= max(1, DefaultPrefixMemory/2) {
		b.oldCls, b.classes = b.classes, map[kvblock.Key]*classStats{}
	}
}

// estimateFor is the prediction for a new session of the given kind drawn
// by prefix k (ok false: none), at now; callers hold mu.
func (b *sessionBook) estimateFor(kind int, k kvblock.Key, ok bool, now time.Time) estimate {
	kc := &b.kinds[kind]
	kc.decay(now)
	e := kc.estimate(nil)
	if c := b.class(k, ok, false); c != nil {
		c.decay(now)
		e = c.estimate(&e)
	}
	return e
}

// view fills each candidate's committed session load and returns what a
// new session with this key, drawn by prefix k, is predicted to bring
// (zero when the key is empty or the session already has a home).
func (b *sessionBook) view(now time.Time, key string, hasHome bool, k kvblock.Key, drawn bool, cands []policy.Candidate) policy.Future {
	if b == nil {
		return policy.Future{}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.expire(now)
	self := b.lookup(key)
	for i := range cands {
		if r := b.reps[cands[i].Replica]; r != nil {
			cands[i].Sessions = *r
			if self != nil && self.live && self.home == cands[i].Replica {
				// The session's own turns are not load it waits behind.
				sl := &cands[i].Sessions
				sl.Sessions--
				sl.Rate = math.Max(0, sl.Rate-self.load.Rate)
				sl.Blocks = math.Max(0, sl.Blocks-self.load.Blocks)
				sl.BlocksSq = math.Max(0, sl.BlocksSq-self.load.BlocksSq)
			}
		}
	}
	if key == "" || hasHome {
		return policy.Future{}
	}
	e := b.estimateFor(keyKind(key), k, drawn, now)
	return policy.Future{Turns: e.turns, Blocks: e.w, BlocksSq: e.w2}
}

// round reports, for a request starting a session of the key (no home),
// whether its key kind is in its round of sessions of unknown future and,
// if so, fills starts[i] with how many of the kind's sessions started on
// cands[i] (decayed like the kind's counts). The round: the kind has seen
// none of its sessions come back (so nothing predicts what its sessions
// bring: Request.Future is 0 for the class and the kind alike) and fewer of
// them start than there are eligible candidates. Conversation keys are
// never in a round: such a key is derived from a conversation's history,
// so its request is a later turn whatever the router saw of its first.
func (b *sessionBook) round(now time.Time, key string, cands []policy.Candidate, starts []float64) bool {
	if b == nil || key == "" {
		return false
	}
	kind := keyKind(key)
	if kind == kindConv {
		return false
	}
	n := 0
	for _, c := range cands {
		if c.Load.Healthy {
			n++
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	kc := &b.kinds[kind]
	kc.decay(now)
	if kc.back > 1e-9 || kc.starts > float64(n)-1+1e-9 || n < 2 {
		return false
	}
	for i, c := range cands {
		starts[i] = kc.on[c.Replica]
	}
	return true
}

// siblings reports whether a request of the session key sent at now is
// parallel (within MinSessionGap of its session's latest turn, whose
// replica is its home) and, if so, how many more requests of its burst
// are expected after it: the mean size of the earlier bursts of the
// session's start class (its kind's while the class has seen no other)
// less the requests of the burst already placed and this one, at least 0.
func (b *sessionBook) siblings(now time.Time, key string) (par bool, more float64, placed int, spread bool) {
	if b == nil || key == "" {
		return false, 0, 0, false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.lookup(key)
	if s == nil || now.Sub(s.last) >= MinSessionGap {
		return false, 0, 0, false
	}
	// The bursts seen before this one (its own, still growing, is left
	// out): the class's once it has one, else the kind's.
	size := 0.0
	for _, c := range b.statsOf(s, now) {
		if n := c.bursts - 1; n > 1e-9 {
			size = 1 + math.Max(0, c.par-float64(s.burst-1))/n
		}
	}
	return true, math.Max(0, size-float64(s.burst+1)), s.burst, s.spread
}

// firstBurst is how many more requests a new session of the key drawn by
// prefix k (drawn false: none) is expected to send with its first, within
// MinSessionGap: the mean burst size of its start class less one, the
// kind's while the class has seen no burst.
func (b *sessionBook) firstBurst(now time.Time, key string, k kvblock.Key, drawn bool) float64 {
	if b == nil || key == "" {
		return 0
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	size := 0.0
	kc := &b.kinds[keyKind(key)]
	kc.decay(now)
	if kc.bursts > 1e-9 {
		size = kc.par / kc.bursts
	}
	if c := b.class(k, drawn, false); c != nil {
		c.decay(now)
		if c.bursts > 1e-9 {
			size = c.par / c.bursts
		}
	}
	return size
}

// spreadBurst marks the session's current burst as spread (its policy
// spread the burst's second request): its later requests spread too.
func (b *sessionBook) spreadBurst(key string) {
	if b == nil || key == "" {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if s := b.lookup(key); s != nil {
		s.spread = true
	}
}

// record notes a decision: the session's request went to replica with
// uncached blocks to prefill; hadHome says whether the router knew the
// session's home (a session without one starts here, in the class of the
// prefix k that drew it).
func (b *sessionBook) record(now time.Time, key string, hadHome bool, k kvblock.Key, drawn bool, replica index.ReplicaID, uncached float64) {
	if b == nil || key == "" {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.expire(now)
	s := b.lookup(key)
	kind := keyKind(key)
	if s == nil || !hadHome {
		if s != nil {
			b.unload(s)
		}
		s = &bookSession{key: key, kind: kind, first: now, last: now, turns: 1, burst: 1}
		if !hadHome {
			s.class, s.classed = k, drawn
			for _, c := range b.statsOf(s, now) {
				c.starts++
			}
			kc := &b.kinds[kind]
			if kc.on == nil {
				kc.on = map[index.ReplicaID]float64{}
			}
			kc.on[replica]++
		}
		for _, c := range b.statsOf(s, now) {
			c.bursts++
		}
		b.put(s)
	} else {
		gap := now.Sub(s.last)
		if gap < MinSessionGap {
			// A parallel request, not a turn: it counts toward its
			// burst's size only.
			s.burst++
			for _, c := range b.statsOf(s, now) {
				c.par++
			}
			return
		}
		s.turns++
		s.burst, s.spread = 1, false
		s.last = now
		s.sumW += uncached
		s.sumW2 += uncached * uncached
		for _, c := range b.statsOf(s, now) {
			if s.turns == 2 {
				c.back++
			}
			c.turns++
			c.sumW += uncached
			c.sumW2 += uncached * uncached
			c.gaps += gap.Seconds()
			c.gapN++
			c.bursts++
		}
		b.unload(s)
		b.put(s)
	}
	s.home = replica
	s.gen++
	b.commit(s, now)
}

// statsOf returns the stats a session's observations go to: its kind's
// and its start prefix's, decayed to now.
func (b *sessionBook) statsOf(s *bookSession, now time.Time) []*classStats {
	out := []*classStats{&b.kinds[s.kind]}
	if c := b.class(s.class, s.classed, true); c != nil {
		out = append(out, c)
	}
	for _, c := range out {
		c.decay(now)
	}
	return out
}

// commit counts the session's predicted turns on its home until its
// horizon.
func (b *sessionBook) commit(s *bookSession, now time.Time) {
	var gap, w, w2, share float64
	if s.turns >= 2 {
		n := float64(s.turns - 1)
		gap = s.last.Sub(s.first).Seconds() / n
		w, w2, share = s.sumW/n, s.sumW2/n, 1
	} else {
		e := b.estimateFor(s.kind, s.class, s.classed, now)
		gap, w, w2, share = e.gap, e.w, e.w2, e.back
	}
	if !(gap > 0) || !(share > 0) {
		return
	}
	rate := share / gap
	s.load = policy.SessionLoad{Rate: rate, Blocks: rate * w, BlocksSq: rate * w2, Sessions: 1}
	r := b.reps[s.home]
	if r == nil {
		r = &policy.SessionLoad{}
		b.reps[s.home] = r
	}
	r.Rate += s.load.Rate
	r.Blocks += s.load.Blocks
	r.BlocksSq += s.load.BlocksSq
	r.Sessions++
	s.live = true
	s.expiry = now.Add(time.Duration(b.horizon * gap * float64(time.Second)))
	heap.Push(&b.exp, expiry{at: s.expiry, s: s, gen: s.gen})
}

// put stores a session, dropping the oldest generation (and its
// committed load) when the current one fills.
func (b *sessionBook) put(s *bookSession) {
	delete(b.old, s.key)
	b.cur[s.key] = s
	if len(b.cur) >= max(1, b.max/2) {
		for _, o := range b.old {
			b.unload(o)
			o.gen++
		}
		b.old, b.cur = b.cur, map[string]*bookSession{}
	}
}

// rekey moves the session recorded under from to the key to, and reports
// whether it did (it does not when from has no record or to has one): a
// conversation whose first turn was keyed by its user (route.SessionKey)
// continues under its opening's key, its turns, gaps and committed load
// with it, rather than leaving a one-shot session behind and starting a
// new one beside it.
func (b *sessionBook) rekey(from, to string) bool {
	if b == nil || from == "" || to == "" {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.lookup(from)
	if s == nil || b.lookup(to) != nil {
		return false
	}
	delete(b.cur, from)
	delete(b.old, from)
	s.key = to
	b.put(s)
	return true
}
