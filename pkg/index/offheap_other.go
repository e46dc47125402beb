//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package index

import "unsafe"

// Elsewhere slot arrays stay on the Go heap.
const offheapOK = false

var pageSize = 4096

func mapSlots(int) unsafe.Pointer { return nil }

func unmapSlots(unsafe.Pointer, int) {}
