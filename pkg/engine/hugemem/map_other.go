//go:build !linux

package hugemem

import "unsafe"

func mapHuge(int) unsafe.Pointer { return nil }

func unmapHuge(unsafe.Pointer, int) {}
