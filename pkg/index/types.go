package index

import (
	"strings"
	"time"

	"github.com/kvroute/kvroute/pkg/kvblock"
)

// ReplicaID names one event stream's cache: a model-server replica, or one
// data-parallel rank of it. It is opaque to the index.
type ReplicaID string

// Tier is where a block lives on a replica.
type Tier uint8

// The tiers, best first.
const (
	TierGPU Tier = iota
	TierCPU
	TierDisk
	NumTiers
)

func (t Tier) String() string {
	switch t {
	case TierGPU:
		return "gpu"
	case TierCPU:
		return "cpu"
	case TierDisk:
		return "disk"
	}
	return "unknown"
}

// ParseMedium maps an engine event's medium to a tier. A nil/empty medium is
// the GPU (vLLM before mediums existed). Unknown mediums report ok=false.
func ParseMedium(medium string) (t Tier, ok bool) {
	switch strings.ToUpper(medium) {
	case "", "GPU", "HBM", "DEVICE":
		return TierGPU, true
	case "CPU", "CPU_PINNED", "HOST", "CPU_TIER", "DRAM":
		return TierCPU, true
	case "DISK", "STORAGE", "FS", "OBJ", "EXTERNAL", "SSD":
		return TierDisk, true
	}
	return TierGPU, false
}

// Stored is a decoded BlockStored event for one replica.
type Stored struct {
	Replica ReplicaID
	// Root is the chain seed (kvblock.Root of the replica's model or the
	// event's LoRA adapter); it is used when the event has no parent.
	Root kvblock.Key
	// HasParent reports whether ParentHash is set (the event continues an
	// existing chain rather than starting at block 0).
	HasParent  bool
	ParentHash uint64
	// Hashes are the engine's block hashes, one per block, in chain order.
	Hashes []uint64
	// Tokens are the token ids of all blocks: len(Hashes)*BlockSize of them.
	Tokens    []uint32
	BlockSize int
	Tier      Tier
	// Extras carries the router-form extra keys per block (cache salt in
	// block 0, multimodal identifiers), as kvblock.Options would build them.
	Extras kvblock.Options
}

// Removed is a decoded BlockRemoved event.
type Removed struct {
	Replica ReplicaID
	Hashes  []uint64
	Tier    Tier
}

// GapHold is how long a replica's view counts as missing blocks the
// replica holds after a store whose parent it did not hold
// (StoreResult.UnknownParent): the store's chain is missing below it, from
// a lost batch or from before the view was cleared. A session whose
// history lost its chain stores each later turn's new blocks below an
// unknown parent again, which keeps the mark while such sessions live.
const GapHold = 2 * time.Minute

// StoreResult says what one Stored event did.
type StoreResult struct {
	// Blocks is the number of blocks indexed.
	Blocks int
	// UnknownParent is set when the event's parent hash was unknown for the
	// replica: nothing was indexed (see the package comment).
	UnknownParent bool
	// BadShape is set when len(Tokens) != len(Hashes)*BlockSize or the block
	// size is not positive: nothing was indexed.
	BadShape bool
	// NoSlot is set when the replica could not be given a slot (more than
	// 2^24 replicas hold entries at once): the blocks from Blocks on were
	// not indexed.
	NoSlot bool
}

// ReplicaMatch is one replica's longest matched prefix.
type ReplicaMatch struct {
	Replica ReplicaID
	// Blocks is the matched depth: the replica holds blocks 0..Blocks-1 of
	// the query in some tier, and not block Blocks.
	Blocks int
	// ByTier counts the matched blocks by the best tier holding each.
	ByTier [NumTiers]int
}

// Stats describes the index's size.
type Stats struct {
	Keys     int // distinct router keys
	Holders  int // (key, replica) entries
	Engine   int // engine-hash -> key mappings over all replicas
	Replicas int // replicas with at least one entry
	// Bytes is the memory the index's structures hold: the allocated
	// capacity of its tables and arena (Go size classes included) plus a
	// fixed estimate per replica. It does not count garbage the Go runtime
	// has yet to collect.
	Bytes  int64
	Budget int64 // configured byte budget (0 = none)
	// Evicted counts (replica, engine hash) entries dropped by budget
	// eviction since start.
	Evicted       int64
	UnknownParent int64 // stored events dropped for an unknown parent
	BadShape      int64 // stored events dropped for a bad shape
	NoSlot        int64 // stored events cut short for want of a replica slot
}
