package hugemem

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// mapHuge maps size bytes (a multiple of hugePage) of zeroed private
// memory aligned to hugePage and advises it for huge pages, or returns nil.
func mapHuge(size int) unsafe.Pointer {
	p, err := unix.MmapPtr(-1, 0, nil, uintptr(size+hugePage), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return nil
	}
	// Give back the unaligned head and the tail past the array.
	head := int((hugePage - uintptr(p)%hugePage) % hugePage)
	if head > 0 {
		unmapHuge(p, head)
	}
	p = unsafe.Add(p, head)
	if tail := hugePage - head; tail > 0 {
		unmapHuge(unsafe.Add(p, size), tail)
	}
	// Advice only: without it (or without huge pages) the memory works
	// the same on ordinary pages.
	_ = unix.Madvise(unsafe.Slice((*byte)(p), size), unix.MADV_HUGEPAGE)
	return p
}

func unmapHuge(p unsafe.Pointer, size int) {
	if err := unix.MunmapPtr(p, uintptr(size)); err != nil {
		panic("hugemem: munmap: " + err.Error())
	}
}
