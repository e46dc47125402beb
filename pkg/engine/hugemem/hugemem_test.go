package hugemem

import (
	"runtime"
	"testing"
	"time"
	"unsafe"
)

type entry struct {
	h    uint64
	a, b int32
	arr  [2]uint16
}

func TestMakeLarge(t *testing.T) {
	before := Mapped()
	n := 3*MinBytes/int(unsafe.Sizeof(entry{})) + 7
	s, r := Make[entry](n)
	if len(s) != n {
		t.Fatalf("len %d, want %d", len(s), n)
	}
	if runtime.GOOS == "linux" {
		if r == nil {
			t.Fatal("a large array was not mapped")
		}
		if p := uintptr(unsafe.Pointer(unsafe.SliceData(s))); p%hugePage != 0 {
			t.Fatalf("array at %#x, not aligned to %d", p, hugePage)
		}
		if got, want := Mapped()-before, int64(4*MinBytes); got != want {
			t.Fatalf("mapped %d bytes, want %d (whole huge pages)", got, want)
		}
	}
	for i := range s {
		if s[i] != (entry{}) {
			t.Fatalf("element %d not zero: %+v", i, s[i])
		}
		s[i] = entry{h: uint64(i), a: int32(i)}
	}
	for i := range s {
		if s[i].h != uint64(i) || s[i].a != int32(i) {
			t.Fatalf("element %d reads %+v", i, s[i])
		}
	}
	r.Free()
	r.Free() // a second Free does nothing
	if got := Mapped(); got != before {
		t.Fatalf("after Free %d bytes mapped, want %d", got, before)
	}
}

func TestMakeSmallStaysOnHeap(t *testing.T) {
	s, r := Make[uint64](16)
	if r != nil || len(s) != 16 {
		t.Fatalf("small array: region %v, len %d", r, len(s))
	}
	r.Free() // nil: no-op
	s, r = Make[uint64](0)
	if r != nil || len(s) != 0 {
		t.Fatalf("empty array: region %v, len %d", r, len(s))
	}
}

func TestUnreachableRegionIsUnmapped(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("mapping only on linux")
	}
	before := Mapped()
	func() {
		s, r := Make[uint64](MinBytes / 8)
		s[len(s)-1] = 1
		if r == nil || Mapped() == before {
			t.Fatal("not mapped")
		}
	}()
	deadline := time.Now().Add(10 * time.Second)
	for Mapped() != before {
		if time.Now().After(deadline) {
			t.Fatalf("%d bytes still mapped after the region became unreachable", Mapped()-before)
		}
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
}

func TestMakeRejectsPointers(t *testing.T) {
	for name, f := range map[string]func(){
		"pointer":        func() { Make[*int](1) },
		"slice field":    func() { Make[struct{ a []byte }](1) },
		"string":         func() { Make[string](1) },
		"array of map":   func() { Make[[2]map[int]int](1) },
		"negative count": func() { Make[int](-1) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", name)
				}
			}()
			f()
		}()
	}
	Make[[0]*int](1) // no pointer in a zero-length array
	Make[struct{ a, b float64 }](1)
}

// TestPrefetchIsOnlyAHint: Prefetch changes no memory and never faults,
// even on addresses that are not mapped (a freed region, nil).
func TestPrefetchIsOnlyAHint(t *testing.T) {
	s, r := Make[uint64](MinBytes / 8)
	for i := range s {
		s[i] = uint64(i) * 3
	}
	for i := range s {
		Prefetch(unsafe.Pointer(&s[i]))
	}
	for i := range s {
		if s[i] != uint64(i)*3 {
			t.Fatalf("element %d changed to %d", i, s[i])
		}
	}
	p := unsafe.Pointer(unsafe.SliceData(s))
	r.Free()
	Prefetch(p) // unmapped now (linux): a load here would fault
	Prefetch(nil)
}
