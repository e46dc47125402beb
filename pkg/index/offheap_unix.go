//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package index

import (
	"syscall"
	"unsafe"
)

const offheapOK = true

var pageSize = syscall.Getpagesize()

// mapSlots maps size bytes of zeroed private memory, or returns nil.
func mapSlots(size int) unsafe.Pointer {
	b, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE|mapPopulate)
	if err != nil {
		return nil
	}
	return unsafe.Pointer(unsafe.SliceData(b))
}

func unmapSlots(p unsafe.Pointer, size int) {
	if err := syscall.Munmap(unsafe.Slice((*byte)(p), size)); err != nil {
		panic("index: munmap: " + err.Error())
	}
}
