package events

import (
	"sync"
	"sync/atomic"

	"github.com/kvroute/kvroute/pkg/index"
	"github.com/kvroute/kvroute/pkg/kvblock"
)

// Sliding-window groups of hybrid-attention engines (vLLM's hybrid KV-cache
// coordinator, e.g. Gemma 2/3, gpt-oss). vLLM 0.33 decides a prefix hit for
// a model with one full-attention and one sliding-window attention type as
// follows (HybridKVCacheCoordinator.find_longest_cache_hit,
// SlidingWindowManager.find_longest_cache_hit): L = the longest prefix of
// blocks the full-attention group holds; then, scanning from block L-1
// down, the first run of ceil((window-1)/block_size) consecutive blocks the
// sliding-window group holds ends the hit; with no such run the hit is the
// run of held blocks from block 0. A long prompt's early sliding-window
// blocks leave the window during its prefill and are freed (evicted first),
// so a shorter prefix of it may hit nothing while its full-attention blocks
// are all still cached.
//
// Windows keeps what the sliding-window groups hold: an Index of its own,
// fed by the stores and removals of groups labelled sliding_window or
// sliding_window_mla (by kv_cache_spec_kind or Source.GroupKinds), keyed
// exactly like the main index (a store's parent is found in this index, or
// else in the main one: the groups share block hashes), and each replica's
// window in blocks, from kv_cache_spec_sliding_window and the store's block
// size. A replica never seen storing in a sliding-window group with a
// window is not hybrid: its matches are left alone. Other partial kinds
// (chunked local attention, mamba) are not modelled: their groups are
// ignored as before. With several sliding-window groups of one replica a
// block counts as held while the last group event about it was a store.
//
// The sliding-window index has no byte budget: it holds what the engines'
// sliding-window groups hold, which their own KV memory bounds, and it is
// cleared with the replica (resync, removal, AllBlocksCleared).
//
// Matcher wraps the main index: its Match cuts each hybrid replica's match
// by the rule above, trimming the slowest tiers first (an engine evicts a
// run's later blocks first, and they are the ones offloaded first).
type Windows struct {
	idx    *index.Index
	hybrid atomic.Bool // any replica has a window

	mu   sync.RWMutex
	need map[index.ReplicaID]int // consecutive blocks a hit needs
}

// NewWindows returns an empty sliding-window view.
func NewWindows() *Windows {
	return &Windows{idx: index.New(index.Config{}), need: make(map[index.ReplicaID]int)}
}

// Index is the index of the sliding-window groups' holdings.
func (w *Windows) Index() *index.Index { return w.idx }

// setWindow records replica r's window (tokens) at block size bs.
func (w *Windows) setWindow(r index.ReplicaID, window, bs int) {
	if window <= 0 || bs <= 0 {
		return
	}
	need := (window - 1 + bs - 1) / bs
	w.mu.RLock()
	cur, ok := w.need[r]
	w.mu.RUnlock()
	if ok && cur == need {
		return
	}
	w.mu.Lock()
	w.need[r] = need
	w.mu.Unlock()
	w.hybrid.Store(true)
}

// Need returns the consecutive blocks replica r's sliding-window group
// must hold for a hit, and whether r is hybrid.
func (w *Windows) Need(r index.ReplicaID) (int, bool) {
	if !w.hybrid.Load() {
		return 0, false
	}
	w.mu.RLock()
	defer w.mu.RUnlock()
	n, ok := w.need[r]
	return n, ok
}

// clear drops what replica r's sliding-window groups hold; forget also
// drops its window.
func (w *Windows) clear(r index.ReplicaID, forget bool) {
	w.idx.Cleared(r)
	if forget {
		w.mu.Lock()
		delete(w.need, r)
		w.mu.Unlock()
	}
}

// Cut returns how many of the first full blocks of keys replica r can
// serve given what its sliding-window group holds, need consecutive blocks
// a hit needs (the rule in the package comment above).
func (w *Windows) Cut(r index.ReplicaID, keys []kvblock.Key, full, need int) int {
	if need <= 0 || full <= 0 {
		return full
	}
	var buf [64]bool
	// Common case: the window before the full hit is held.
	from := max(0, full-need)
	held := w.idx.Held(r, keys[from:full], buf[:0])
	all := true
	for _, h := range held {
		all = all && h
	}
	if all && from > 0 {
		return full
	}
	if from > 0 {
		held = w.idx.Held(r, keys[:full], held[:0])
	}
	return windowCut(held, need)
}

// windowCut applies vLLM's sliding-window hit rule to held[i] = whether
// block i is held, for a full-attention hit of len(held) blocks.
func windowCut(held []bool, need int) int {
	run := 0
	for i := len(held) - 1; i >= 0; i-- {
		if !held[i] {
			run = 0
			continue
		}
		run++
		if run >= need {
			return i + run
		}
	}
	return run
}

// Matcher is an index's Match with hybrid replicas' matches cut to what
// their sliding-window groups can serve. It implements route.Matcher.
type Matcher struct {
	Full    *index.Index
	Windows *Windows
}

// Match is Full.Match, each hybrid replica's match cut by Windows.Cut.
func (m Matcher) Match(keys []kvblock.Key, dst []index.ReplicaMatch) []index.ReplicaMatch {
	start := len(dst)
	dst = m.Full.Match(keys, dst)
	if m.Windows == nil || !m.Windows.hybrid.Load() {
		return dst
	}
	for i := start; i < len(dst); i++ {
		rm := &dst[i]
		need, ok := m.Windows.Need(rm.Replica)
		if !ok {
			continue
		}
		cut := m.Windows.Cut(rm.Replica, keys, rm.Blocks, need)
		if cut >= rm.Blocks {
			continue
		}
		drop := rm.Blocks - cut
		for t := int(index.NumTiers) - 1; t >= 0 && drop > 0; t-- { // int: Tier is unsigned
			d := min(drop, rm.ByTier[t])
			rm.ByTier[t] -= d
			drop -= d
		}
		rm.Blocks = cut
	}
	return dst
}
