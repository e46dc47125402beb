//go:build darwin || freebsd || netbsd || openbsd || dragonfly

package index

const mapPopulate = 0
