//go:build !amd64 && !arm64

package index

import "unsafe"

func prefetch(unsafe.Pointer) {}

func prefetchAll(*uintptr, int) {}
