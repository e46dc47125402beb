//go:build !amd64 && !arm64

package hugemem

import "unsafe"

// Prefetch does nothing on this platform (see prefetch_asm.go).
func Prefetch(unsafe.Pointer) {}
