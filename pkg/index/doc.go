// Package index is the router's prefix index: which replica holds which KV
// block, on which tier.
//
// Keys are the router's own block keys (package kvblock). Engines name blocks
// by their own digests, so for every replica the index keeps engine hash ->
// router key; that is what a BlockRemoved event needs. A BlockStored event
// carries the tokens of its blocks and the engine hash of the parent block;
// the index recomputes the router keys from the parent's key and the tokens.
//
// A stored event whose parent hash is unknown for the replica can never be
// reached from block 0: it is counted (StoreResult.UnknownParent) and not
// indexed. Its descendants then have unknown parents too, and are dropped the
// same way, until the replica is cleared and relearned (the events layer
// resyncs it).
//
// Match answers, for a request's keys, every replica's longest matched prefix
// in one descent: a replica drops out at its first missing block, so an
// interior hole truncates its match.
//
// The index is safe for concurrent use. It starts no goroutine, reads no
// clock and does not log.
package index
