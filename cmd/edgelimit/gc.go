package main

import (
	"fmt"
	"os"
	"runtime/debug"
)

// defaultGCPercent is the PoP's garbage collection target (--gc-percent)
// unless configured: 0, Go's own (GOGC's default of 100).
//
// The model: a collection cycle marks the live heap, and one starts each
// time the program has allocated GOGC% of the live heap since the last. A
// PoP's live heap is mostly its key table, and what it allocates is mostly
// per request (net/http's request and header maps, the response's
// headers), so the marking work per request is
//
//	live heap × (bytes a request allocates / (live heap × GOGC/100))
//	= bytes a request allocates × 100/GOGC,
//
// whatever the number of keys. That work is taken from the requests being
// served while it runs — a quarter of the cores for the mark workers, and
// assists charged to the goroutines that allocate while it marks. A higher
// target divides it, and the cycles, by GOGC/100; the price is memory: the
// heap may grow to (1 + GOGC/100) × the live heap between cycles, which a
// full default --max-keys table (about 150 MB live) makes 750 MB at 400
// against 300 MB at Go's 100. How much of the tail of a steady rate it
// removes depends on how busy the cores are (docs/performance-redis.md),
// so the default keeps Go's memory bound.
const defaultGCPercent = 0

// setGCPercent sets the garbage collection target to percent, unless
// percent is 0 (Go's default, 100) or the environment's GOGC sets it (Go's
// own setting wins).
func setGCPercent(percent int) error {
	if percent < 0 {
		return fmt.Errorf("--gc-percent must be >= 0, got %d", percent)
	}
	if _, ok := os.LookupEnv("GOGC"); ok || percent == 0 {
		return nil
	}
	debug.SetGCPercent(percent)
	return nil
}
