//go:build !amd64

package simulate

// prefetch does nothing on this architecture.
func prefetch(addr uintptr) {}
