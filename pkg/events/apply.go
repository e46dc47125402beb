package events

import (
	"strings"

	"github.com/kvroute/kvroute/pkg/index"
	"github.com/kvroute/kvroute/pkg/kvblock"
)

// ApplyStats counts what applying one batch did.
type ApplyStats struct {
	Stored, Removed, Cleared int    // events applied, by type
	StoredBlocks             int    // blocks indexed by BlockStored events
	RemovedBlocks            int    // blocks removed by BlockRemoved events
	UnknownParentBlocks      int    // blocks of stores whose parent was unknown
	BadShape                 int    // stores with len(tokens) != blocks*block_size
	UnknownMedium            int    // events with a medium that maps to no tier
	OtherGroup               int    // stores and removals of partial-attention KV-cache groups, skipped
	UnknownKind              int    // events of a group whose kv_cache_spec_kind is unknown (presumed full attention)
	UnknownKindName          string // the last such kind
	GroupHeld                int    // removed hashes kept because another group still holds them
	BlockSizeMismatch        int    // stores whose block size differs from the expected one
	NoSlot                   int    // stores cut short: the index had no replica slot left
	// EngineBlockSize is the block size of the last store (0 if none):
	// what the engine publishes (SGLang's page size).
	EngineBlockSize int
	// Lookahead is the number of lookahead tokens per block of the last
	// store that carried lookahead_token_ids (0 if none): the n a request
	// must be hashed with (kvblock.Options.WithLookahead).
	Lookahead int
}

// Applier applies decoded batches of one replica to an index. It keeps
// scratch buffers, so it is not safe for concurrent use; one Applier per
// worker goroutine.
type Applier struct {
	idx     *index.Index
	extras  [][]byte
	removed []uint64
	groups  map[index.ReplicaID]*groupTracker
	// win, when set, receives the sliding-window groups' stores and
	// removals (window.go).
	win *Windows
}

// SetWindows makes the Applier feed w with the stores and removals of
// sliding-window KV-cache groups.
func (a *Applier) SetWindows(w *Windows) { a.win = w }

// NewApplier returns an Applier writing to idx.
func NewApplier(idx *index.Index) *Applier {
	return &Applier{idx: idx, groups: make(map[index.ReplicaID]*groupTracker)}
}

// Forget drops what the Applier tracks of a replica (its KV-cache group
// holdings): call it whenever the replica is cleared in the index other
// than by an AllBlocksCleared event it applied.
func (a *Applier) Forget(r index.ReplicaID) {
	delete(a.groups, r)
	if a.win != nil {
		a.win.clear(r, true)
	}
}

// Reset drops a replica's KV-cache group holdings but keeps the group kinds
// it learned: call it when the replica is cleared in the index for a resync.
func (a *Applier) Reset(r index.ReplicaID) {
	if g := a.groups[r]; g != nil {
		g.clear()
	}
	if a.win != nil {
		a.win.clear(r, false)
	}
}

func (a *Applier) tracker(t Target) *groupTracker {
	g := a.groups[t.Replica]
	if g == nil {
		g = newGroupTracker()
		if t.GroupKinds != "" {
			for i, k := range strings.Split(t.GroupKinds, ",") {
				if k = strings.TrimSpace(k); k != "" && i < maxGroups {
					g.kinds[i] = classifyKind(k)
				}
			}
		}
		a.groups[t.Replica] = g
	}
	return g
}

// Target names the replica a batch belongs to and how to interpret it.
type Target struct {
	Replica index.ReplicaID
	Model   string
	// BlockSize is the block size the router hashes requests for this
	// model with; a store with another size is indexed as given and
	// counted. 0 disables the check.
	BlockSize int
	// GroupKinds labels KV-cache groups by index (Source.GroupKinds).
	GroupKinds string
}

// Apply applies b's events in order and returns what they did.
func (a *Applier) Apply(t Target, b *Batch) ApplyStats {
	var st ApplyStats
	for i := range b.Events {
		ev := &b.Events[i]
		switch ev.Type {
		case EventBlockStored:
			a.stored(t, ev, &st)
		case EventBlockRemoved:
			a.blockRemoved(t, ev, &st)
		case EventAllBlocksCleared:
			st.Cleared++
			a.idx.Cleared(t.Replica)
			if g := a.groups[t.Replica]; g != nil {
				g.clear()
			}
			if a.win != nil {
				a.win.clear(t.Replica, false)
			}
		}
	}
	return st
}

// eventTier maps an event's medium and locality to the index tier. A block
// in a REMOTE tier (network storage the engine reads from, vLLM offload
// tiers with locality REMOTE) is held at the slowest tier whatever its
// medium says: the engine can load it, at storage speed.
func eventTier(ev *Event) (index.Tier, bool) {
	tier, ok := index.ParseMedium(ev.Medium)
	if ok && ev.Locality == "REMOTE" {
		tier = index.TierDisk
	}
	return tier, ok
}

// groupKind classifies an event's KV-cache group (see groups.go): its
// kind, skip for a partial-attention or sliding-window group (the main
// index does not take them), and the replica's tracker when the event
// names a group.
func (a *Applier) groupKind(t Target, ev *Event, st *ApplyStats) (g *groupTracker, kind groupKind, skip bool) {
	if ev.GroupIdx >= 0 {
		g = a.tracker(t)
		kind = g.kind(ev.GroupIdx, ev.SpecKind)
	} else {
		kind = classifyKind(ev.SpecKind)
	}
	switch kind {
	case kindPartial, kindSliding:
		st.OtherGroup++
		return nil, kind, true
	case kindUnknown:
		st.UnknownKind++
		st.UnknownKindName = ev.SpecKind
	}
	return g, kind, false
}

func (a *Applier) blockRemoved(t Target, ev *Event, st *ApplyStats) {
	tier, ok := eventTier(ev)
	if !ok {
		st.UnknownMedium++
		return
	}
	hashes := ev.Hashes
	g, kind, skip := a.groupKind(t, ev, st)
	if skip {
		if kind == kindSliding && a.win != nil {
			a.win.idx.Removed(index.Removed{Replica: t.Replica, Hashes: hashes, Tier: tier})
		}
		return
	}
	if g != nil {
		var kept int
		a.removed, kept = g.removed(a.removed[:0], ev.GroupIdx, tier, hashes)
		hashes = a.removed
		st.GroupHeld += kept
	}
	st.Removed++
	if len(hashes) > 0 {
		st.RemovedBlocks += a.idx.Removed(index.Removed{Replica: t.Replica, Hashes: hashes, Tier: tier})
	}
}

func (a *Applier) stored(t Target, ev *Event, st *ApplyStats) {
	g, kind, skip := a.groupKind(t, ev, st)
	if skip {
		if kind == kindSliding && a.win != nil {
			a.windowStored(t, ev)
		}
		return
	}
	tier, ok := eventTier(ev)
	if !ok {
		st.UnknownMedium++
		return
	}
	if ev.BlockSize <= 0 || len(ev.Tokens) != len(ev.Hashes)*ev.BlockSize ||
		(ev.Lookahead != nil && len(ev.Lookahead) != len(ev.Hashes)) {
		st.BadShape++
		return
	}
	st.EngineBlockSize = ev.BlockSize
	if len(ev.Lookahead) > 0 {
		st.Lookahead = len(ev.Lookahead[0])
	}
	if t.BlockSize > 0 && ev.BlockSize != t.BlockSize {
		st.BlockSizeMismatch++
		if g != nil {
			return
		}
	}
	opts := StoredOptions(ev, a.extras)
	if opts.Extras != nil {
		a.extras = opts.Extras[:0]
	}
	res := a.idx.Stored(index.Stored{
		Replica:    t.Replica,
		Root:       kvblock.Root(t.Model, ev.LoRAName),
		HasParent:  ev.HasParent,
		ParentHash: ev.Parent,
		Hashes:     ev.Hashes,
		Tokens:     ev.Tokens,
		BlockSize:  ev.BlockSize,
		Tier:       tier,
		Extras:     opts,
	})
	switch {
	case res.UnknownParent:
		st.UnknownParentBlocks += len(ev.Hashes)
	case res.BadShape:
		st.BadShape++
	case res.NoSlot:
		st.NoSlot++
		st.StoredBlocks += res.Blocks
	default:
		st.Stored++
		st.StoredBlocks += res.Blocks
	}
	if g != nil && res.Blocks > 0 {
		g.stored(ev.GroupIdx, tier, ev.Hashes[:res.Blocks])
	}
}

// windowStored applies a sliding-window group's store to the Windows view:
// keyed as the main index keys it, the parent found in the view or else in
// the main index (the groups share block hashes).
func (a *Applier) windowStored(t Target, ev *Event) {
	tier, ok := eventTier(ev)
	if !ok || ev.BlockSize <= 0 || len(ev.Tokens) != len(ev.Hashes)*ev.BlockSize ||
		(ev.Lookahead != nil && len(ev.Lookahead) != len(ev.Hashes)) ||
		(t.BlockSize > 0 && ev.BlockSize != t.BlockSize) {
		return
	}
	a.win.setWindow(t.Replica, ev.SlidingWindow, ev.BlockSize)
	opts := StoredOptions(ev, a.extras)
	if opts.Extras != nil {
		a.extras = opts.Extras[:0]
	}
	s := index.Stored{
		Replica:   t.Replica,
		Root:      kvblock.Root(t.Model, ev.LoRAName),
		Hashes:    ev.Hashes,
		Tokens:    ev.Tokens,
		BlockSize: ev.BlockSize,
		Tier:      tier,
		Extras:    opts,
	}
	if ev.HasParent {
		parent, ok := a.win.idx.EngineKey(t.Replica, ev.Parent)
		if !ok {
			parent, ok = a.idx.EngineKey(t.Replica, ev.Parent)
		}
		if !ok {
			a.win.idx.Removed(index.Removed{Replica: t.Replica, Hashes: ev.Hashes, Tier: tier})
			return
		}
		// Chain from the parent's key; only block 0 of a chain carries
		// the salt, and a store with a parent never starts there.
		s.Root = parent
		s.Extras.CacheSalt = ""
	}
	a.win.idx.Stored(s)
}
