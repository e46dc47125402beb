package hugemem

import (
	"fmt"
	"reflect"
	"runtime"
	"sync/atomic"
	"unsafe"
)

// MinBytes is the smallest array Make maps outside the heap: smaller
// arrays span too few huge pages to gain from them.
const MinBytes = 2 << 20

// hugePage is the transparent huge page size of x86-64 and arm64 Linux.
const hugePage = 2 << 20

// Region is one mapped array.
type Region struct {
	base    unsafe.Pointer
	size    int
	cleanup runtime.Cleanup
	freed   atomic.Bool
}

// mapped is the total of the regions not yet unmapped (for tests).
var mapped atomic.Int64

// Mapped returns the bytes mapped by every live Region.
func Mapped() int64 { return mapped.Load() }

// Make returns a zeroed slice of n elements of T and its Region (nil when
// the slice is an ordinary Go slice). It panics if T holds pointers or n
// is negative.
func Make[T any](n int) ([]T, *Region) {
	t := reflect.TypeFor[T]()
	if hasPointers(t) {
		panic(fmt.Sprintf("hugemem: %v holds pointers", t))
	}
	if n < 0 {
		panic("hugemem: negative length")
	}
	size := n * int(t.Size())
	if size < MinBytes {
		return make([]T, n), nil
	}
	size = (size + hugePage - 1) &^ (hugePage - 1)
	p := mapHuge(size)
	if p == nil {
		return make([]T, n), nil
	}
	r := &Region{base: p, size: size}
	mapped.Add(int64(size))
	r.cleanup = runtime.AddCleanup(r, func(m span) { m.unmap() }, span{p, size})
	return unsafe.Slice((*T)(p), n), r
}

// Free unmaps the region (the slice must not be used afterwards). Free of
// a nil or already freed Region does nothing.
func (r *Region) Free() {
	if r == nil || r.freed.Swap(true) {
		return
	}
	r.cleanup.Stop()
	span{r.base, r.size}.unmap()
}

type span struct {
	base unsafe.Pointer
	size int
}

func (s span) unmap() {
	unmapHuge(s.base, s.size)
	mapped.Add(-int64(s.size))
}

// hasPointers reports whether values of t hold Go pointers.
func hasPointers(t reflect.Type) bool {
	switch t.Kind() {
	case reflect.Bool, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr,
		reflect.Float32, reflect.Float64, reflect.Complex64, reflect.Complex128:
		return false
	case reflect.Array:
		return t.Len() > 0 && hasPointers(t.Elem())
	case reflect.Struct:
		for i := range t.NumField() {
			if hasPointers(t.Field(i).Type) {
				return true
			}
		}
		return false
	}
	return true
}
