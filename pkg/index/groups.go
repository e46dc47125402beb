package index

import "github.com/kvroute/kvroute/pkg/kvblock"

// Lookups for an Index that holds one KV-cache group of its replicas
// (pkg/events keeps the sliding-window groups of hybrid-attention engines
// in an Index of their own): whether a replica holds each of some keys, and
// the router key a replica's engine hash maps to. Both take the read lock
// once and change nothing (no reference bit is set).

// Held appends to dst, for each of keys, whether replica r holds it on any
// tier.
func (ix *Index) Held(r ReplicaID, keys []kvblock.Key, dst []bool) []bool {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	rs := ix.replicaFor(r, false)
	for _, k := range keys {
		held := false
		if rs != nil {
			if ks := ix.keys.find(uint64(k)); ks != nil {
				held = ix.arena.holdsSlot(ks.v, rs.slot)
			}
		}
		dst = append(dst, held)
	}
	return dst
}

// EngineKey returns the router key replica r's engine hash h maps to, if
// r holds h on some tier.
func (ix *Index) EngineKey(r ReplicaID, h uint64) (kvblock.Key, bool) {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	rs := ix.replicaFor(r, false)
	if rs == nil {
		return 0, false
	}
	es := rs.eng.find(h)
	if es == nil {
		return 0, false
	}
	return kvblock.Key(es.v), true
}
