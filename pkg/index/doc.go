// Package index is the router's prefix index: which replica holds which KV
// block, on which tier.
//
// # What it records
//
// Keys are the router's own block keys (package kvblock). Engines name blocks
// by their own digests, so for every replica the index keeps engine hash ->
// router key; that is what a BlockRemoved event needs. A BlockStored event
// carries the tokens of its blocks and the engine hash of the parent block;
// the index recomputes the router keys from the parent's key and the tokens.
// Block i of an event with a parent is never chain position 0, so the cache
// salt (which kvblock folds into block 0 only) never applies to it.
//
// For every key the index keeps its holders: per replica, a reference count
// per tier (GPU, CPU, disk) of the replica's engine hashes that map to the
// key. The same engine hash stored on two tiers counts once on each, and
// removing it from one tier keeps the other; two engine hashes that map to
// one key on one replica (hybrid models' cache groups) count twice, and the
// replica holds the key until both are removed. A count saturates at 4095:
// past that, removals may drop the holder before its last engine hash goes
// (affinity is lost, a block is never claimed that is not held). A store of
// an engine hash that the replica already maps to another key replaces that
// mapping (the engine reused the hash for other content).
//
// A stored event whose parent hash is unknown for the replica can never be
// reached from block 0: it is counted (StoreResult.UnknownParent,
// Stats.UnknownParent) and not indexed. Its blocks' keys cannot be computed,
// so any older mapping of the same engine hashes on that replica is dropped
// as well. Its descendants then have unknown parents too, and are dropped the
// same way, until the replica is cleared and relearned (the events layer
// resyncs it).
//
// Match answers, for a request's keys, every replica's longest matched prefix
// in one descent: a replica drops out at its first missing block, so an
// interior hole truncates its match, and the descent stops at the first
// block no replica still matching holds. Each matched block is counted under
// the best tier that holds it. All keys are known before the descent, so
// Match looks them up in batches of 16, the next batch's home slots
// prefetched (in one call) before the current batch is read. When every
// holder of the first block has a replica slot below 64, the replicas still
// matching are a bitmask, and a block that the one or two live replicas
// hold inline on the GPU costs one masked compare of the key word;
// otherwise they are a list in slot order.
//
// # Layout
//
// All tables are extendible hashes of small open-addressing sub-tables with
// Robin Hood linear probing and backward-shift deletion, over 16-byte slots.
// A full sub-table of about a thousand slots splits in two; smaller ones are
// rebuilt half as large again; sparse ones shrink. So no operation ever
// rehashes more than about a thousand entries, and memory follows the
// number of entries smoothly (load between 0.6 and 0.9).
//
//   - The key table maps a router key to its holders. One or two holders
//     (the common case) are kept inline in the key's 16-byte slot, 31 bits
//     each: a 22-bit replica slot and a 3-bit count per tier. A holder set
//     that does not fit (three or more holders, a slot of 2^22 or more, a
//     count above 7) spills to a record in the holder arena of full holder
//     words (24-bit replica slot, three 12-bit tier counts), sorted by slot
//     (at most 32768 per key; more replicas are not recorded, which loses
//     affinity only), after a header with two masks over the slots below
//     64 (those holding the key; those of them holding it below the GPU
//     only), so that Match reads one cache line per shared-prefix key; it
//     goes back inline as soon as it fits. The slot also carries the key's
//     CLOCK reference bit. A lookup reads one 16-byte directory entry
//     (which copies the sub-table's address, size and depth) and then the
//     slots: no pointer chase in between.
//   - Each replica has an engine table: engine hash -> router key, with the
//     tiers the hash is stored on kept in the hash's top 3 bits (engine
//     hashes are therefore compared on their low 61 bits).
//   - Replicas get small slots (up to 2^24 at a time); the slot of a replica
//     that was cleared and left empty is reused.
//
// # Concurrency
//
// The index is safe for concurrent use by many matchers and writers. A
// readers-writer lock guards it. Match holds the read lock for its whole
// descent, so it sees the index as it was between two writer steps; it
// takes no other lock and allocates nothing when dst has room and either
// every holder of the first block has a slot below 64 or at most 32
// replicas hold it. It sets the reference bits of the keys it used (up to
// where the descent stopped), and only those that are clear, so matching
// keys already referenced dirties no cache line. Writers never
// hold the write lock for long: Stored and Removed apply their blocks in
// chunks of 32 per lock hold (router keys are hashed outside the lock),
// Cleared detaches the replica's engine table at once and releases its keys
// 256 at a time, and eviction works in steps of at most 512 entries. A
// chunk may include one sub-table rebuild, itself bounded. So a matcher
// waits at most for one short step, however long the event, and a match
// concurrent with a long event sees a prefix of it. Events for one replica
// should come from one goroutine, in order (the events layer does that);
// the index stays consistent either way.
//
// # Memory
//
// Stats.Bytes is what the structures hold: the capacity of every table and
// of the arena as allocated (Go size classes or whole pages included), freed
// slot arrays kept for reuse, plus a fixed estimate per replica; it does not
// count garbage the Go runtime has yet to collect. With Config.MaxBytes set, the
// index keeps Stats.Bytes within the budget at every step, growth included:
// before each writer chunk it evicts down to the budget less the largest
// growth one chunk has shown (a sub-table split, a directory doubling, an
// arena chunk; at most an eighth of the budget). Slot arrays of 4 KiB or
// more are mapped from the OS outside the Go heap (they hold no Go
// pointers) and unmapped as soon as a rebuild frees them, unless the budget
// is under 4 MiB, where page-sized steps would make eviction coarse; a
// cleanup unmaps what a dropped index still holds. So rebuilds hand the
// collector little garbage, and the process's peak (heap plus mapped
// arrays) stays near the budget without GOMEMLIMIT. Freed slot arrays are
// also pooled by size (at most an eighth of the budget) and reused. Near the budget,
// sub-tables are rebuilt denser (load 0.8 to 0.9) so that freed entries
// give their bytes back. Eviction is a CLOCK over the replicas'
// engine entries: the hand skips an entry whose key was stored or matched
// since the hand last passed (clearing the key's reference bit) and evicts
// any other, releasing its holds. Eviction loses affinity, never
// correctness: a match after it may be shorter than the truth, never longer.
// A replica whose entries were evicted may later report one as its parent:
// that event is then an unknown-parent event, as above. The holder arena
// gives memory back only when it is entirely unused, so it is as large as
// its peak.
//
// The package starts no goroutine, reads no clock and does not log.
package index
