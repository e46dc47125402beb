//go:build amd64 || arm64

package index

import "unsafe"

// prefetch asks the CPU to bring the cache line at p closer. Unlike a load,
// it does not hold up the instructions after it while the line is fetched.
//
//go:noescape
func prefetch(p unsafe.Pointer)

// prefetchAll prefetches the cache lines at the n addresses from p on (one
// call for a batch of addresses).
//
//go:noescape
func prefetchAll(p *uintptr, n int)
