package route

import (
	"slices"
	"sync"
	"time"

	"github.com/kvroute/kvroute/pkg/index"
	"github.com/kvroute/kvroute/pkg/kvblock"
)

// ApproxStats describes an ApproxIndex.
type ApproxStats struct {
	Keys    int   // distinct block keys
	Entries int   // (block key, replica) entries, expired ones not yet dropped included
	Evicted int64 // entries dropped for MaxEntries since start
	Expired int64 // entries dropped after their TTL since start
}

// ApproxIndex is the dispatch-learned prefix index of the approximate mode:
// block key -> replicas that were sent a request carrying it, each with an
// expiry. It knows nothing of engine state: a replica is assumed to hold a
// block for TTL after it was last sent it, unless the entry is evicted for
// size first. Entries form one list in dispatch order (least recent last),
// which with a single TTL is also expiry order: expired entries are dropped
// from the tail on every Record, and the tail is what MaxEntries evicts. A
// request's blocks are recorded deepest first, so block 0 is the most recent
// and a prefix loses its tail before its head (an interior hole would cut
// the match short anyway).
//
// A long record is written, and a long match read, in chunks of
// recordChunk keys, each under the lock, so neither waits for more than
// one chunk of the other (a Match may see a record that lands between its
// chunks in part: the index is approximate anyway). A record that must be seen
// by every Match from a point on (the router's Pending, recorded under
// the router's lock) is staged first: Stage keeps the keys in a short list
// Match also reads (a longest common prefix against each), and Commit,
// called after the caller's own lock is released, writes them in and
// drops the staged copy.
//
// It is safe for concurrent use (one RWMutex: Match reads, Record, Stage
// and Commit write). It reads no clock: callers pass now. It starts no
// goroutine.
type ApproxIndex struct {
	ttl int64
	max int

	mu      sync.RWMutex
	keys    map[kvblock.Key]*approxEntry // a key's first holder
	lru     approxEntry                  // sentinel: lru.next is the most recent entry
	free    *approxEntry                 // dropped entries for reuse, linked by sib
	nfree   int
	n       int
	evicted int64
	expired int64
	staged  []*Staged // staged records not yet committed, in Stage order
}

// Staged is a record Stage keeps visible to Match until Commit writes it in.
type Staged struct {
	keys    []kvblock.Key
	replica index.ReplicaID
	now     time.Time
}

// recordChunk is how many keys Record writes, and Match reads, per lock
// hold: a long prompt's walk is thousands of cache misses, and readers and
// writers of other prompts interleave between chunks.
const recordChunk = 64

// maxFree bounds the dropped entries kept for reuse.
const maxFree = 1024

// approxEntry is one (key, replica) entry: in the dispatch-order list
// (prev, next) and in its key's list of holders (sib).
type approxEntry struct {
	key        kvblock.Key
	replica    index.ReplicaID
	expires    int64 // unix nanoseconds
	prev, next *approxEntry
	sib        *approxEntry
}

// NewApproxIndex returns an empty index; zero or negative fields of cfg take
// their defaults.
func NewApproxIndex(cfg ApproxConfig) *ApproxIndex {
	cfg.TTL, cfg.MaxEntries = max(cfg.TTL, 0), max(cfg.MaxEntries, 0)
	cfg = cfg.WithDefaults()
	x := &ApproxIndex{ttl: int64(cfg.TTL), max: cfg.MaxEntries, keys: map[kvblock.Key]*approxEntry{}}
	x.lru.next, x.lru.prev = &x.lru, &x.lru
	return x
}

// Match appends to dst, for every replica, the longest prefix of keys it
// holds unexpired at now, in one descent: a replica drops out at its first
// missing or expired block. Replicas matching nothing are not reported.
// Matched blocks are counted on the GPU tier.
func (x *ApproxIndex) Match(keys []kvblock.Key, now time.Time, dst []index.ReplicaMatch) []index.ReplicaMatch {
	t := now.UnixNano()
	start := len(dst)
	x.mu.RLock()
	defer func() { x.mu.RUnlock() }()
	for i, k := range keys {
		if i%recordChunk == 0 && i > 0 { // let a waiting Record in
			x.mu.RUnlock()
			x.mu.RLock()
		}
		first := x.keys[k]
		if i == 0 {
			for h := first; h != nil; h = h.sib {
				if h.expires > t {
					dst = append(dst, index.ReplicaMatch{Replica: h.replica, Blocks: 1})
				}
			}
			if len(dst) == start {
				break
			}
			continue
		}
		alive := false
		for j := start; j < len(dst); j++ {
			if dst[j].Blocks != i {
				continue // dropped out earlier
			}
			for h := first; h != nil; h = h.sib {
				if h.replica == dst[j].Replica && h.expires > t {
					dst[j].Blocks++
					alive = true
					break
				}
			}
		}
		if !alive {
			break
		}
	}
	for _, st := range x.staged {
		if st.now.UnixNano()+x.ttl <= t {
			continue
		}
		n := commonPrefix(keys, st.keys)
		if n == 0 {
			continue
		}
		j := start
		for j < len(dst) && dst[j].Replica != st.replica {
			j++
		}
		if j == len(dst) {
			dst = append(dst, index.ReplicaMatch{Replica: st.replica})
		}
		dst[j].Blocks = max(dst[j].Blocks, n)
	}
	for j := start; j < len(dst); j++ {
		dst[j].ByTier[index.TierGPU] = dst[j].Blocks
	}
	return dst
}

// Record notes that a request carrying keys was sent to replica at now:
// each (key, replica) entry expires TTL after now and becomes the most
// recent. Expired entries are dropped, then the least recent ones while
// over MaxEntries. Keys are written deepest first, recordChunk at a time:
// until the last chunk (block 0) is in, a Match sees none of them.
func (x *ApproxIndex) Record(keys []kvblock.Key, replica index.ReplicaID, now time.Time) {
	for end := len(keys); end > 0; end -= recordChunk {
		x.recordChunk(keys[max(0, end-recordChunk):end], replica, now)
	}
}

// Stage makes a record of keys visible to every later Match at once (a
// Match compares keys with each staged record's, a sequential scan) and
// returns it for Commit, which the caller must call, preferably outside
// any lock of its own. keys are copied.
func (x *ApproxIndex) Stage(keys []kvblock.Key, replica index.ReplicaID, now time.Time) *Staged {
	st := &Staged{keys: slices.Clone(keys), replica: replica, now: now}
	t := now.UnixNano()
	x.mu.Lock()
	// A staged record past its TTL matches nothing: drop it even if its
	// Commit never comes.
	x.staged = slices.DeleteFunc(x.staged, func(o *Staged) bool { return o.now.UnixNano()+x.ttl <= t })
	x.staged = append(x.staged, st)
	x.mu.Unlock()
	return st
}

// Commit writes a staged record in (as Record) and then stops matching
// its staged copy.
func (x *ApproxIndex) Commit(st *Staged) {
	x.Record(st.keys, st.replica, st.now)
	x.mu.Lock()
	if i := slices.Index(x.staged, st); i >= 0 {
		x.staged = slices.Delete(x.staged, i, i+1)
	}
	x.mu.Unlock()
}

func (x *ApproxIndex) recordChunk(keys []kvblock.Key, replica index.ReplicaID, now time.Time) {
	t := now.UnixNano()
	exp := t + x.ttl
	x.mu.Lock()
	defer x.mu.Unlock()
	for e := x.lru.prev; e != &x.lru && e.expires <= t; e = x.lru.prev {
		x.remove(e)
		x.expired++
	}
	for i := len(keys) - 1; i >= 0; i-- {
		k := keys[i]
		first := x.keys[k]
		e := first
		for e != nil && e.replica != replica {
			e = e.sib
		}
		if e == nil {
			if e = x.free; e != nil {
				x.free, x.nfree = e.sib, x.nfree-1
			} else {
				e = new(approxEntry)
			}
			e.key, e.replica, e.sib = k, replica, first
			x.keys[k] = e
			x.n++
		} else {
			e.prev.next, e.next.prev = e.next, e.prev // unlink
		}
		e.expires = exp
		e.prev, e.next = &x.lru, x.lru.next // push front
		x.lru.next.prev = e
		x.lru.next = e
	}
	for x.n > x.max {
		x.remove(x.lru.prev)
		x.evicted++
	}
}

// commonPrefix is the length of the longest common prefix of a and b.
func commonPrefix(a, b []kvblock.Key) int {
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}

// remove unlinks e from both lists and keeps it for reuse. Callers hold mu.
func (x *ApproxIndex) remove(e *approxEntry) {
	e.prev.next, e.next.prev = e.next, e.prev
	switch first := x.keys[e.key]; {
	case first == e && e.sib == nil:
		delete(x.keys, e.key)
	case first == e:
		x.keys[e.key] = e.sib
	default:
		p := first
		for p.sib != e {
			p = p.sib
		}
		p.sib = e.sib
	}
	x.n--
	*e = approxEntry{}
	if x.nfree < maxFree {
		e.sib, x.free = x.free, e
		x.nfree++
	}
}

// Stats returns the index's size and drop counts.
func (x *ApproxIndex) Stats() ApproxStats {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return ApproxStats{Keys: len(x.keys), Entries: x.n, Evicted: x.evicted, Expired: x.expired}
}

// approxRoot is the chain seed of the approximate mode's keys: distinct
// from every kvblock.Root (the LoRA adapter is prefixed too, since
// kvblock.Root ignores the model when an adapter is named), and distinct
// between approximate ids and exact token ids, so that neither can ever
// match the other or a key learned from engine events.
func approxRoot(model, lora string, exact bool) kvblock.Key {
	p := "kvroute/approx\x00"
	if exact {
		p = "kvroute/dispatch\x00"
	}
	if lora != "" {
		return kvblock.Root("", p+lora)
	}
	return kvblock.Root(p+model, "")
}
