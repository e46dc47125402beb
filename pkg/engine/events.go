package engine

// EventKind is the type of a KV-cache event, named as vLLM names it.
type EventKind uint8

// The event kinds.
const (
	BlockStored EventKind = iota + 1
	BlockRemoved
	AllBlocksCleared
)

func (k EventKind) String() string {
	switch k {
	case BlockStored:
		return "BlockStored"
	case BlockRemoved:
		return "BlockRemoved"
	case AllBlocksCleared:
		return "AllBlocksCleared"
	}
	return "unknown"
}

// The mediums an event can name.
const (
	MediumGPU = "GPU"
	MediumCPU = "CPU"
)

// Event is one KV-cache event, independent of its wire encoding (see package
// kvwire). Fields not meaningful for a kind are zero.
type Event struct {
	Kind EventKind
	// Hashes are the engine's 64-bit block ids, in chain order.
	Hashes []uint64
	// Parent is the hash of the block before Hashes[0]; HasParent is false
	// when Hashes[0] is block 0 of its chain (published as nil).
	Parent    uint64
	HasParent bool
	// Tokens are the tokens of all stored blocks, BlockSize per block.
	Tokens    []uint32
	BlockSize int
	// LoRAID and LoRAName name the adapter (0 and "" for the base model).
	LoRAID   int
	LoRAName string
	// Medium is MediumGPU or MediumCPU.
	Medium string
	// ExtraKeys has one entry per stored block: the block's extra hash keys
	// in vLLM's order (LoRA name, then the cache salt on block 0), or nil.
	ExtraKeys [][]string
	// Group is the KV-cache group (vLLM's group_idx): 0 for the
	// full-attention group, GroupSlidingWindow for a hybrid model's
	// sliding-window group. Set on BlockStored and BlockRemoved.
	Group int
	// SpecKind and SlidingWindow describe the group on BlockStored, as vLLM
	// 0.33 labels every store: SpecFullAttention or SpecSlidingWindow, and
	// the window in tokens (0 for full attention).
	SpecKind      string
	SlidingWindow int
}

// The KV-cache groups of a hybrid engine and their kv_cache_spec_kind.
const (
	GroupFullAttention = 0
	GroupSlidingWindow = 1

	SpecFullAttention = "full_attention"
	SpecSlidingWindow = "sliding_window"
)
