// Package hugemem allocates large arrays of pointer-free elements outside
// the Go heap, in anonymous memory advised for transparent huge pages
// (madvise MADV_HUGEPAGE), for the simulator's big hash tables.
//
// Why: the engine model's block-location tables and the simulator's table
// of every block hash are probed at random, one cache line per probe, over
// tens to hundreds of MB. With 4 KiB pages nearly every probe also misses
// the TLB (and on a virtual machine a TLB miss walks two page tables); Go's
// heap gets no huge pages when the system's transparent_hugepage setting is
// "madvise" (the runtime no longer advises its heap since Go 1.21.1). An
// array mapped here, 2 MiB-aligned and advised, is backed by huge pages
// where the kernel has them, and by ordinary pages otherwise: its contents
// are the same either way, only the speed of reaching them changes.
//
// Contract: Make returns a zeroed slice and the Region holding it. The
// element type must hold no Go pointers (the collector does not scan the
// region; Make panics on a type with pointers). The slice is valid until
// the Region is freed: Free unmaps it at once; a Region that becomes
// unreachable without Free is unmapped by a cleanup, so the caller must keep
// the Region reachable for as long as it uses the slice (keep both in one
// struct). Arrays smaller than MinBytes, other platforms and a failed
// mapping fall back to an ordinary Go slice (nil Region; Free of nil is a
// no-op). The package starts no goroutine and is safe for concurrent use.
package hugemem
