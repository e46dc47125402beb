package route

import (
	"math"
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
// The entries live in one slice, linked by slot numbers, with replicas
// named by small numbers (a number whose replica holds no entry is reused),
// and the key table maps a key to a slot: nothing the index holds is a
// pointer, so the garbage collector never walks it (as the router's
// Pending it is full at MaxEntries under large prompts, and a
// pointer-linked index of that size was marked on every cycle). The slice
// keeps its peak length, at most MaxEntries plus one chunk, 32 bytes an
// entry; slots freed by expiry and eviction are reused first.
//
// It is safe for concurrent use (one RWMutex: Match reads, Record, Stage
// and Commit write). It reads no clock: callers pass now. It starts no
// goroutine.
type ApproxIndex struct {
	ttl int64
	max int

	mu      sync.RWMutex
	keys    map[kvblock.Key]int32 // a key's first holder
	ents    []approxEntry         // ents[0] is the dispatch-order list's sentinel: ents[0].next is the most recent entry
	free    int32                 // first slot of the dropped entries, linked by sib; 0 for none
	n       int
	evicted int64
	expired int64
	staged  []*Staged // staged records not yet committed, in Stage order

	// Replicas by number: the ID of each number in use, its entries, the
	// number of each ID, and the numbers free for reuse.
	replicas []index.ReplicaID
	holds    []int32
	numbers  map[index.ReplicaID]uint32
	spare    []uint32

	// betweenChunks, set by tests only, runs while a Match holds no lock
	// between two chunks: where a Record may land.
	betweenChunks func()
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

// maxApproxEntries is the largest MaxEntries an ApproxIndex takes: its
// slots are numbered by int32, and a chunk may pass MaxEntries before the
// least recent entries are evicted.
const maxApproxEntries = math.MaxInt32 - 2*recordChunk

// approxEntry is one (key, replica) entry: in the dispatch-order list
// (prev, next) and in its key's list of holders (sib), by slot; slot 0 ends
// a holders' list.
type approxEntry struct {
	key        kvblock.Key
	expires    int64 // unix nanoseconds
	prev, next int32
	sib        int32
	replica    uint32 // number, see ApproxIndex.replicas
}

// NewApproxIndex returns an empty index; zero or negative fields of cfg take
// their defaults, and MaxEntries is at most 2^31 - 129.
func NewApproxIndex(cfg ApproxConfig) *ApproxIndex {
	cfg.TTL, cfg.MaxEntries = max(cfg.TTL, 0), max(cfg.MaxEntries, 0)
	cfg = cfg.WithDefaults()
	return &ApproxIndex{
		ttl:     int64(cfg.TTL),
		max:     min(cfg.MaxEntries, maxApproxEntries),
		keys:    map[kvblock.Key]int32{},
		ents:    make([]approxEntry, 1, min(cfg.MaxEntries, 1024)+1),
		numbers: map[index.ReplicaID]uint32{},
	}
}

// Match appends to dst, for every replica, the longest prefix of keys it
// holds unexpired at now, in one descent: a replica drops out at its first
// missing or expired block. Replicas matching nothing are not reported.
// Matched blocks are counted on the GPU tier.
func (x *ApproxIndex) Match(keys []kvblock.Key, now time.Time, dst []index.ReplicaMatch) []index.ReplicaMatch {
	t := now.UnixNano()
	start := len(dst)
	var buf [16]uint32
	nums := buf[:0] // the number of each replica in dst[start:]
	x.mu.RLock()
	defer func() { x.mu.RUnlock() }()
	for i, k := range keys {
		if i%recordChunk == 0 && i > 0 { // let a waiting Record in
			x.mu.RUnlock()
			if x.betweenChunks != nil {
				x.betweenChunks()
			}
			x.mu.RLock()
			// A replica whose entries all went meanwhile may have
			// lost its number to another: it matches no further.
			for j, r := range nums {
				if int(r) >= len(x.replicas) || x.replicas[r] != dst[start+j].Replica {
					nums[j] = math.MaxUint32
				}
			}
		}
		first := x.keys[k]
		if i == 0 {
			for h := first; h != 0; h = x.ents[h].sib {
				if e := &x.ents[h]; e.expires > t {
					dst = append(dst, index.ReplicaMatch{Replica: x.replicas[e.replica], Blocks: 1})
					nums = append(nums, e.replica)
				}
			}
			if len(dst) == start {
				break
			}
			continue
		}
		alive := false
		for j, r := range nums {
			if dst[start+j].Blocks != i {
				continue // dropped out earlier
			}
			for h := first; h != 0; h = x.ents[h].sib {
				if e := &x.ents[h]; e.replica == r && e.expires > t {
					dst[start+j].Blocks++
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
	for e := x.ents[0].prev; e != 0 && x.ents[e].expires <= t; e = x.ents[0].prev {
		x.remove(e)
		x.expired++
	}
	r := x.number(replica)
	for i := len(keys) - 1; i >= 0; i-- {
		k := keys[i]
		first := x.keys[k]
		e := first
		for e != 0 && x.ents[e].replica != r {
			e = x.ents[e].sib
		}
		if e == 0 {
			e = x.slot()
			x.ents[e] = approxEntry{key: k, replica: r, sib: first}
			x.keys[k] = e
			x.n++
			x.holds[r]++
		} else {
			x.unlink(e)
		}
		// Push front.
		en, head := &x.ents[e], x.ents[0].next
		en.expires, en.prev, en.next = exp, 0, head
		x.ents[head].prev = e
		x.ents[0].next = e
	}
	for x.n > x.max {
		x.remove(x.ents[0].prev)
		x.evicted++
	}
}

// number returns replica's number, giving it one if it has none. Callers
// hold mu for writing.
func (x *ApproxIndex) number(replica index.ReplicaID) uint32 {
	if r, ok := x.numbers[replica]; ok {
		return r
	}
	var r uint32
	if n := len(x.spare); n > 0 {
		r, x.spare = x.spare[n-1], x.spare[:n-1]
		x.replicas[r] = replica
	} else {
		r = uint32(len(x.replicas))
		x.replicas = append(x.replicas, replica)
		x.holds = append(x.holds, 0)
	}
	x.numbers[replica] = r
	return r
}

// slot returns a free slot of ents, growing it if none is. Callers hold mu
// for writing, and keep no pointer into ents across the call.
func (x *ApproxIndex) slot() int32 {
	if e := x.free; e != 0 {
		x.free = x.ents[e].sib
		return e
	}
	x.ents = append(x.ents, approxEntry{})
	return int32(len(x.ents) - 1)
}

// unlink takes slot e out of the dispatch-order list. Callers hold mu for
// writing.
func (x *ApproxIndex) unlink(e int32) {
	prev, next := x.ents[e].prev, x.ents[e].next
	x.ents[prev].next, x.ents[next].prev = next, prev
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

// remove unlinks slot e from both lists and frees it for reuse, and the
// number of its replica with it if that was the replica's last entry.
// Callers hold mu for writing.
func (x *ApproxIndex) remove(e int32) {
	x.unlink(e)
	en := &x.ents[e]
	switch first := x.keys[en.key]; {
	case first == e && en.sib == 0:
		delete(x.keys, en.key)
	case first == e:
		x.keys[en.key] = en.sib
	default:
		p := first
		for x.ents[p].sib != e {
			p = x.ents[p].sib
		}
		x.ents[p].sib = en.sib
	}
	x.n--
	if r := en.replica; x.holds[r] == 1 {
		x.holds[r] = 0
		delete(x.numbers, x.replicas[r])
		x.replicas[r] = ""
		x.spare = append(x.spare, r)
	} else {
		x.holds[r]--
	}
	*en = approxEntry{sib: x.free}
	x.free = e
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
