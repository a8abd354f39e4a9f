package simulate

// prefetch asks the processor to bring the cache line at addr closer
// without waiting for it: unlike a load, it never holds up the instructions
// after it. addr need not be valid.
//
//go:noescape
func prefetch(addr uintptr)
