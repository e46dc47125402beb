package events

import (
	"github.com/kvroute/kvroute/pkg/index"
	"github.com/kvroute/kvroute/pkg/kvblock"
)

// ApplyStats counts what applying one batch did.
type ApplyStats struct {
	Stored, Removed, Cleared int // events applied, by type
	StoredBlocks             int // blocks indexed by BlockStored events
	RemovedBlocks            int // blocks removed by BlockRemoved events
	UnknownParentBlocks      int // blocks of stores whose parent was unknown
	BadShape                 int // stores with len(tokens) != blocks*block_size
	UnknownMedium            int // events with a medium that maps to no tier
	OtherGroup               int // stores of non-attention KV-cache groups, skipped
	BlockSizeMismatch        int // stores whose block size differs from the expected one
	NoSlot                   int // stores cut short: the index had no replica slot left
}

// Applier applies decoded batches of one replica to an index. It keeps
// scratch buffers, so it is not safe for concurrent use; one Applier per
// worker goroutine.
type Applier struct {
	idx    *index.Index
	extras [][]byte
}

// NewApplier returns an Applier writing to idx.
func NewApplier(idx *index.Index) *Applier { return &Applier{idx: idx} }

// Target names the replica a batch belongs to and how to interpret it.
type Target struct {
	Replica index.ReplicaID
	Model   string
	// BlockSize is the block size the router hashes requests for this
	// model with; a store with another size is indexed as given and
	// counted. 0 disables the check.
	BlockSize int
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
			tier, ok := index.ParseMedium(ev.Medium)
			if !ok {
				st.UnknownMedium++
				continue
			}
			st.Removed++
			st.RemovedBlocks += a.idx.Removed(index.Removed{Replica: t.Replica, Hashes: ev.Hashes, Tier: tier})
		case EventAllBlocksCleared:
			st.Cleared++
			a.idx.Cleared(t.Replica)
		}
	}
	return st
}

// attentionKind reports whether a KV-cache group kind describes prefix
// reuse. Sliding-window and state-space groups evict their early blocks as
// a matter of course; indexing them would make removals of those groups
// erase blocks the attention group still holds.
func attentionKind(kind string) bool {
	switch kind {
	case "", "full_attention", "mla_attention", "FullAttentionSpec", "MLAAttentionSpec":
		return true
	}
	return false
}

func (a *Applier) stored(t Target, ev *Event, st *ApplyStats) {
	if !attentionKind(ev.SpecKind) {
		st.OtherGroup++
		return
	}
	tier, ok := index.ParseMedium(ev.Medium)
	if !ok {
		st.UnknownMedium++
		return
	}
	if ev.BlockSize <= 0 || len(ev.Tokens) != len(ev.Hashes)*ev.BlockSize {
		st.BadShape++
		return
	}
	if t.BlockSize > 0 && ev.BlockSize != t.BlockSize {
		st.BlockSizeMismatch++
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
}
