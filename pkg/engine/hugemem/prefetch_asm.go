//go:build amd64 || arm64

package hugemem

import "unsafe"

// Prefetch starts loading the cache line at p, so that a later access to
// it (a probe of a table slot) need not wait for memory: a caller that
// knows the next several slots it will probe prefetches them all first,
// and their misses overlap instead of following one another. A hint only:
// it never faults (p may be any address) and changes no memory.
//
//go:noescape
func Prefetch(p unsafe.Pointer)
