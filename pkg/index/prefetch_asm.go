//go:build amd64 || arm64

package index

import "unsafe"

// prefetch asks the CPU to bring the cache line at p closer. Unlike a load,
// it does not hold up the instructions after it while the line is fetched.
//
//go:noescape
func prefetch(p unsafe.Pointer)
