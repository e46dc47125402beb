package index

import (
	"sync"

	"github.com/kvroute/kvroute/pkg/kvblock"
)

// Index is the router's prefix index. It is safe for concurrent use by many
// matchers and writers.
type Index struct {
	cfg Config

	mu       sync.RWMutex
	keys     map[kvblock.Key]*node
	replicas map[ReplicaID]*replicaState
	slots    []ReplicaID
	evicted  int64
}

type node struct {
	holders map[uint32]*[NumTiers]uint32 // replica slot -> refcount per tier
}

type engEntry struct {
	key   kvblock.Key
	tiers uint8 // bit t set: stored in tier t
}

type replicaState struct {
	slot   uint32
	engine map[uint64]engEntry
}

// New returns an empty index. It starts no goroutine.
func New(cfg Config) *Index {
	return &Index{
		cfg:      cfg,
		keys:     make(map[kvblock.Key]*node),
		replicas: make(map[ReplicaID]*replicaState),
	}
}

func (ix *Index) replica(r ReplicaID) *replicaState {
	rs := ix.replicas[r]
	if rs == nil {
		rs = &replicaState{slot: uint32(len(ix.slots)), engine: make(map[uint64]engEntry)}
		ix.slots = append(ix.slots, r)
		ix.replicas[r] = rs
	}
	return rs
}

// Stored applies a BlockStored event.
func (ix *Index) Stored(ev Stored) StoreResult {
	if ev.BlockSize <= 0 || len(ev.Tokens) != len(ev.Hashes)*ev.BlockSize {
		return StoreResult{BadShape: true}
	}
	ix.mu.Lock()
	defer ix.mu.Unlock()
	rs := ix.replica(ev.Replica)
	parent := ev.Root
	if ev.HasParent {
		pe, ok := rs.engine[ev.ParentHash]
		if !ok {
			return StoreResult{UnknownParent: true}
		}
		parent = pe.key
	}
	// Block i of the event sits at chain position offset+i; only position
	// 0 carries the salt. An event with a parent never starts at block 0.
	first := 0
	if ev.HasParent {
		first = 1
	}
	bit := uint8(1) << ev.Tier
	for i, h := range ev.Hashes {
		extra := ev.Extras.Extra(i)
		if first == 1 && ev.Extras.CacheSalt != "" {
			extra = kvblock.Options{Extras: ev.Extras.Extras}.Extra(i)
		}
		k := kvblock.Chain(parent, ev.Tokens[i*ev.BlockSize:(i+1)*ev.BlockSize], extra)
		parent = k
		e, had := rs.engine[h]
		if had && e.key != k {
			// The engine reused a hash for other content: drop the old mapping.
			ix.dropEngine(rs, h, e)
			had, e = false, engEntry{}
		}
		if had && e.tiers&bit != 0 {
			continue
		}
		e.key = k
		e.tiers |= bit
		rs.engine[h] = e
		n := ix.keys[k]
		if n == nil {
			n = &node{holders: make(map[uint32]*[NumTiers]uint32, 1)}
			ix.keys[k] = n
		}
		c := n.holders[rs.slot]
		if c == nil {
			c = new([NumTiers]uint32)
			n.holders[rs.slot] = c
		}
		c[ev.Tier]++
	}
	return StoreResult{Blocks: len(ev.Hashes)}
}

// dropEngine removes every tier of one engine hash.
func (ix *Index) dropEngine(rs *replicaState, h uint64, e engEntry) {
	for t := range NumTiers {
		if e.tiers&(1<<t) != 0 {
			ix.unhold(rs.slot, e.key, t)
		}
	}
	delete(rs.engine, h)
}

func (ix *Index) unhold(slot uint32, k kvblock.Key, t Tier) {
	n := ix.keys[k]
	if n == nil {
		return
	}
	c := n.holders[slot]
	if c == nil || c[t] == 0 {
		return
	}
	c[t]--
	if c[0]|c[1]|c[2] == 0 {
		delete(n.holders, slot)
		if len(n.holders) == 0 {
			delete(ix.keys, k)
		}
	}
}

// Removed applies a BlockRemoved event. Unknown hashes are ignored.
func (ix *Index) Removed(ev Removed) (removed int) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	rs := ix.replicas[ev.Replica]
	if rs == nil {
		return 0
	}
	bit := uint8(1) << ev.Tier
	for _, h := range ev.Hashes {
		e, ok := rs.engine[h]
		if !ok || e.tiers&bit == 0 {
			continue
		}
		ix.unhold(rs.slot, e.key, ev.Tier)
		e.tiers &^= bit
		if e.tiers == 0 {
			delete(rs.engine, h)
		} else {
			rs.engine[h] = e
		}
		removed++
	}
	return removed
}

// Cleared forgets everything the replica holds (AllBlocksCleared, a restart,
// a resync, or the replica leaving the set).
func (ix *Index) Cleared(r ReplicaID) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	rs := ix.replicas[r]
	if rs == nil {
		return
	}
	for h, e := range rs.engine {
		ix.dropEngine(rs, h, e)
	}
}

// Match returns, appended to dst, every replica whose cache holds at least
// the first block of keys, with its longest matched prefix. It makes one
// descent: a replica drops out at its first missing block.
func (ix *Index) Match(keys []kvblock.Key, dst []ReplicaMatch) []ReplicaMatch {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	base := len(dst)
	for depth, k := range keys {
		n := ix.keys[k]
		if n == nil {
			break
		}
		if depth == 0 {
			for slot, c := range n.holders {
				m := ReplicaMatch{Replica: ix.slots[slot], Blocks: 1}
				m.ByTier[best(c)]++
				dst = append(dst, m)
			}
			continue
		}
		alive := false
		for i := base; i < len(dst); i++ {
			m := &dst[i]
			if m.Blocks != depth {
				continue
			}
			c := n.holders[ix.replicas[m.Replica].slot]
			if c == nil {
				continue
			}
			m.Blocks++
			m.ByTier[best(c)]++
			alive = true
		}
		if !alive {
			break
		}
	}
	return dst
}

func best(c *[NumTiers]uint32) Tier {
	for t := range NumTiers {
		if c[t] > 0 {
			return t
		}
	}
	return TierGPU
}

// Stats reports the index's size.
func (ix *Index) Stats() Stats {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	s := Stats{Keys: len(ix.keys), Budget: ix.cfg.MaxBytes, Evicted: ix.evicted}
	for _, n := range ix.keys {
		s.Holders += len(n.holders)
	}
	for _, rs := range ix.replicas {
		s.Engine += len(rs.engine)
		if len(rs.engine) > 0 {
			s.Replicas++
		}
	}
	s.Bytes = int64(s.Keys)*64 + int64(s.Holders)*48 + int64(s.Engine)*32
	return s
}
