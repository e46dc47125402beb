package events

import "github.com/kvroute/kvroute/pkg/index"

// KV-cache groups (vLLM's hybrid memory allocator). A hybrid model (Gemma
// 2/3, gpt-oss, Llama 4, Jamba, ...) keeps one KV-cache group per attention
// type; events name it in group_idx. Groups with the same block size share
// block hashes, so the same engine hash is stored, and later removed, once
// per group. The index keeps one entry per (replica, engine hash, tier) and
// has no notion of groups; the groupTracker decides which stores and
// removals reach it:
//
//   - Group kinds come from kv_cache_spec_kind when an event carries it
//     (vLLM 0.33 labels every BlockStored, GPU and offload, with its
//     group's kind and window; BlockRemoved carries group_idx only) and are
//     remembered per group (across resyncs); Source.GroupKinds labels groups
//     up front ("full_attention,sliding_window"); an event's kind wins. full_attention, mla_attention and
//     sink_full_attention are full attention. sliding_window,
//     sliding_window_mla, chunked_local_attention, mamba,
//     encoder_only_attention and cross_attention are partial: their blocks
//     do not make a prefix hit on their own, so their stores are not
//     indexed and their removals are ignored (skipped{reason="other_group"}).
//     A group never labelled is presumed full attention. Any other kind
//     (vLLM's "unknown", or a kind newer than this code) is counted in
//     unknown_spec_kind_total, logged once, and presumed full attention:
//     its blocks are indexed, never silently dropped.
//   - For every indexed store the tracker records which groups hold the
//     hash on that tier. A removal clears only the naming group's bit; the
//     index entry is removed only when no group holds the hash on that tier
//     any more (group_held_total counts removals kept for another group).
//     So a sliding-window group that vLLM did not label cannot erase what
//     the full-attention group holds; the price is that such a block stays
//     indexed until every group has evicted it.
//   - A group-tagged store whose block size differs from the replica's
//     configured one is not indexed (block_size_mismatch_total): its keys
//     could never match a request, and its tail hashes coincide with the
//     hashes of the configured size's blocks.
//   - Events without group_idx (older vLLM, SGLang) bypass the tracker.
//
// Groups 0..15 are tracked separately; higher indices share group 15.
// Sliding-window groups are not indexed, but their stores and removals
// feed the Windows view (window.go), which cuts a hybrid replica's match to
// what its sliding-window group can serve, as vLLM's coordinator does.

type groupKind uint8

const (
	kindPresumed groupKind = iota // never labelled: presumed full attention
	kindFull
	kindPartial
	kindSliding // partial, and its holdings decide hits (window.go)
	kindUnknown // labelled with a kind this code does not know: presumed full
)

// classifyKind maps a kv_cache_spec_kind string (vLLM's KVCacheSpecKind
// values, or class names of early builds) to a groupKind.
func classifyKind(kind string) groupKind {
	switch kind {
	case "":
		return kindPresumed
	case "full_attention", "mla_attention", "sink_full_attention",
		"FullAttentionSpec", "MLAAttentionSpec", "SinkFullAttentionSpec":
		return kindFull
	case "sliding_window", "sliding_window_mla", "SlidingWindowSpec", "SlidingWindowMLASpec":
		return kindSliding
	case "chunked_local_attention", "mamba", "encoder_only_attention", "cross_attention",
		"ChunkedLocalAttentionSpec", "MambaSpec":
		return kindPartial
	}
	return kindUnknown
}

const maxGroups = 16

// groupBit is the bit of (group, tier) in a holding mask: 16 groups × 4
// tiers in 64 bits.
func groupBit(group int, tier index.Tier) uint64 {
	return 1 << (uint(min(group, maxGroups-1))*4 + uint(tier))
}

// tierMask selects every group's bit of one tier.
func tierMask(tier index.Tier) uint64 {
	const every = 0x1111_1111_1111_1111
	return every << uint(tier)
}

// groupTracker is one replica's group state. Owned by the worker applying
// the replica's batches.
type groupTracker struct {
	kinds [maxGroups]groupKind
	held  map[uint64]uint64 // engine hash -> groupBit mask
}

func newGroupTracker() *groupTracker { return &groupTracker{held: make(map[uint64]uint64)} }

// kind returns group g's kind, learning it from label when set.
func (g *groupTracker) kind(group int, label string) groupKind {
	i := min(group, maxGroups-1)
	if label != "" {
		g.kinds[i] = classifyKind(label)
	}
	return g.kinds[i]
}

// stored records that group holds hashes on tier.
func (g *groupTracker) stored(group int, tier index.Tier, hashes []uint64) {
	bit := groupBit(group, tier)
	for _, h := range hashes {
		g.held[h] |= bit
	}
}

// removed clears group's bit of hashes on tier and returns, appended to dst,
// the hashes no group holds on that tier any more (to remove from the
// index), and how many were kept for another group. A hash the tracker
// never saw is passed through.
func (g *groupTracker) removed(dst []uint64, group int, tier index.Tier, hashes []uint64) ([]uint64, int) {
	bit, tm := groupBit(group, tier), tierMask(tier)
	kept := 0
	for _, h := range hashes {
		m, ok := g.held[h]
		if !ok {
			dst = append(dst, h)
			continue
		}
		m &^= bit
		if m == 0 {
			delete(g.held, h)
		} else {
			g.held[h] = m
		}
		if m&tm != 0 {
			kept++
			continue
		}
		dst = append(dst, h)
	}
	return dst, kept
}

// clear forgets every holding (AllBlocksCleared, resync); kinds are kept.
func (g *groupTracker) clear() { clear(g.held) }
